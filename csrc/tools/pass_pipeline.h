// The pass pipeline of shardwise-opt and the golden tests (owned by the IR text/pass work).
#pragma once
