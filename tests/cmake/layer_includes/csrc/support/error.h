// Fixture of the include check (tests/cmake/layer_includes): a header of the lowest layer.
#pragma once
