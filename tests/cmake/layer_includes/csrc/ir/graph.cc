// Fixture: ir may include support and itself, not search, nor climb out with "../".
#include "ir/graph.h"
#include "search/placement.h"
#include "support/error.h"

#include <fmt/format.h>
#include "../search/placement.h"
