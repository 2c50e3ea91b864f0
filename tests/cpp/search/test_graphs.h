// GPT graphs for the planner tests: the GPT-3 paper's shapes at batch 1 (seq 2048 and vocab
// 51200 unless given), built without torch.
#pragma once

#include "ir/graph.h"
#include "models/gpt.h"

namespace shardwise::search::testing {

inline ir::Graph gpt_at_batch(int layers, int hidden, int heads, int seq, int vocab, int batch) {
  models::GptConfig c;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.seq = seq;
  c.vocab = vocab;
  c.batch = batch;
  return models::build_gpt(c);
}

inline ir::Graph gpt(int layers, int hidden, int heads, int seq = 2048, int vocab = 51200) {
  return gpt_at_batch(layers, hidden, heads, seq, vocab, 1);
}

}  // namespace shardwise::search::testing
