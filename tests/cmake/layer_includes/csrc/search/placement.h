// Fixture: a header of a layer above ir.
#pragma once
