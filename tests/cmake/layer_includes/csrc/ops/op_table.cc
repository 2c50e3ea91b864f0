// Fixture: ops includes only layers it reaches (ir, support) and others' headers.
#include "ir/graph.h"
#include "support/error.h"

#include <fmt/format.h>
#include <vector>
