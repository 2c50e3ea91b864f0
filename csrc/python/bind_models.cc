// Python face of the torch-free model builders (csrc/models): shardwise._C.build_gpt returns
// a _C.Graph; python/shardwise/models/gpt.py wraps it as a shardwise.Graph.
#include <pybind11/stl.h>

#include <string>

#include "ir/dtype.h"
#include "models/gpt.h"
#include "python/bindings.h"
#include "support/error.h"

namespace py = pybind11;

namespace shardwise::python {

void bind_models(py::module_& m) {
  const models::GptConfig kGptDefaults{};
  m.def(
      "build_gpt",
      [](int layers, int hidden, int heads, int seq, int vocab, int batch, const std::string& dtype, int ffn_hidden,
         bool tie_embeddings, bool with_loss, int positions, double dropout, double layer_norm_eps,
         const std::string& attention) {
        const auto parsed = ir::parse_dtype(dtype);
        if (!parsed) {
          throw support::ValidationError("build_gpt: unknown dtype '" + dtype + "' (expected bf16, f16, f32 or f64)");
        }
        if (attention != "sdpa" && attention != "eager" && attention != "math") {
          throw support::ValidationError("build_gpt: unknown attention '" + attention +
                                         "' (expected sdpa, eager or math)");
        }
        models::GptConfig config{.layers = layers,
                                 .hidden = hidden,
                                 .heads = heads,
                                 .seq = seq,
                                 .vocab = vocab,
                                 .batch = batch,
                                 .dtype = *parsed,
                                 .ffn_hidden = ffn_hidden,
                                 .tie_embeddings = tie_embeddings,
                                 .with_loss = with_loss,
                                 .positions = positions,
                                 .dropout = dropout,
                                 .layer_norm_eps = layer_norm_eps,
                                 .attention = attention == "eager"  ? models::GptAttention::Eager
                                              : attention == "math" ? models::GptAttention::Math
                                                                    : models::GptAttention::Sdpa};
        return models::build_gpt(config);
      },
      // The defaults are GptConfig's own (models/gpt.h), read from there.
      py::kw_only(), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("seq"), py::arg("vocab"),
      py::arg("batch") = kGptDefaults.batch, py::arg("dtype") = std::string(ir::dtype_name(kGptDefaults.dtype)),
      py::arg("ffn_hidden") = kGptDefaults.ffn_hidden, py::arg("tie_embeddings") = kGptDefaults.tie_embeddings,
      py::arg("with_loss") = kGptDefaults.with_loss, py::arg("positions") = kGptDefaults.positions,
      py::arg("dropout") = kGptDefaults.dropout, py::arg("layer_norm_eps") = kGptDefaults.layer_norm_eps,
      py::arg("attention") = std::string("sdpa"),  // GptConfig's default, GptAttention::Sdpa
      "The graph a capture of transformers' GPT2LMHeadModel gives, built from its configuration (models/gpt.h).");
}

}  // namespace shardwise::python
