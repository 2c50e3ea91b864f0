#include "tools/pass_pipeline.h"
