// Fixture: a header of ir.
#pragma once
#include "support/error.h"
