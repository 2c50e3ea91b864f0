#include "schedule/timeline_svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace shardwise::schedule {
namespace {

// How each kind of interval is drawn: its fill and its legend's label, one row a kind.
struct IntervalStyle {
  IntervalKind kind;
  std::string_view fill;
  std::string_view label;
};
constexpr IntervalStyle kStyles[] = {
    {IntervalKind::Forward, "#4c8bf5", "forward"},
    {IntervalKind::Backward, "#34a853", "backward"},
    {IntervalKind::WeightGradient, "#a8dab5", "weight gradient"},
    {IntervalKind::Send, "#f29900", "send (async)"},
    {IntervalKind::RecvWait, "#ea4335", "recv wait"},
    {IntervalKind::Update, "#9334e6", "update"},
    {IntervalKind::Idle, "#eeeeee", "idle"},
};
constexpr IntervalStyle kUnknownStyle{IntervalKind::Idle, "#000000", ""};

const IntervalStyle& style_of(IntervalKind kind) {
  for (const IntervalStyle& style : kStyles)
    if (style.kind == kind) return style;
  return kUnknownStyle;
}

std::string_view fill_of(IntervalKind kind) { return style_of(kind).fill; }

std::string legend_label(IntervalKind kind) { return std::string(style_of(kind).label); }

// A "nice" tick step (1, 2, 5 x 10^n) giving about `target` ticks over `span`.
double tick_step(double span, int target) {
  if (span <= 0.0) return 1.0;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (raw <= f * mag) return f * mag;
  return 10.0 * mag;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string timeline_svg(const SimulationResult& result, const PipelineSchedule& schedule,
                         const TimelineSvgOptions& options) {
  std::size_t longest = 0;
  for (const std::string& label : options.rank_labels) longest = std::max(longest, label.size());
  const double label_w = longest > 0 ? 70.0 + 6.5 * static_cast<double>(longest) : 70.0;
  const double margin = 10.0;
  const double title_h = options.title.empty() ? 0.0 : 24.0;
  const double row_h = options.row_height;
  const double gap = 4.0;
  const int ranks = static_cast<int>(result.timelines.size());
  const double span = result.step_time > 0.0 ? result.step_time : 1.0;
  const double scale = options.width / span;
  const double rows_top = margin + title_h;
  const double rows_bottom = rows_top + ranks * (row_h + gap);
  const double axis_h = 30.0;
  const double legend_h = 24.0;
  const double total_w = label_w + options.width + 2 * margin;
  const double total_h = rows_bottom + axis_h + legend_h + margin;
  const double x0 = margin + label_w;

  std::string s;
  s += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" viewBox=\"0 0 {:.0f} {:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      total_w, total_h, total_w, total_h);
  s += fmt::format("<rect x=\"0\" y=\"0\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"#ffffff\"/>\n", total_w, total_h);
  if (!options.title.empty())
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n", margin,
                     margin + 14.0, xml_escape(options.title));

  for (int r = 0; r < ranks; ++r) {
    const double y = rows_top + r * (row_h + gap);
    s += fmt::format("<g class=\"rank\" data-rank=\"{}\">\n", r);
    const auto u = static_cast<std::size_t>(r);
    const std::string label = u < options.rank_labels.size() && !options.rank_labels[u].empty()
                                  ? fmt::format("rank {} {}", r, options.rank_labels[u])
                                  : fmt::format("rank {}", r);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" dominant-baseline=\"middle\">{}</text>\n", margin,
                     y + row_h / 2, xml_escape(label));
    // Two passes: the tiling intervals first, then the Send strips on top of them.
    for (int pass = 0; pass < 2; ++pass) {
      for (const Interval& iv : result.timelines[static_cast<std::size_t>(r)]) {
        if ((iv.kind == IntervalKind::Send) != (pass == 1)) continue;
        const bool compute = iv.kind == IntervalKind::Forward || iv.kind == IntervalKind::Backward ||
                             iv.kind == IntervalKind::WeightGradient;
        const double w = (iv.end - iv.start) * scale;
        if (!compute && w <= 0.0) continue;
        const double x = x0 + iv.start * scale;
        const bool send = iv.kind == IntervalKind::Send;
        const double ry = send ? y + row_h - 5.0 : y;
        const double rh = send ? 4.0 : row_h;
        const char* name = interval_kind_name(iv.kind);
        s += fmt::format(
            "<rect class=\"interval {}\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"",
            name, x, ry, std::max(w, 0.0), rh, fill_of(iv.kind));
        if (compute) s += " stroke=\"#ffffff\" stroke-width=\"0.5\"";
        s += "><title>";
        if (iv.micro_batch >= 0)
          s += xml_escape(
              fmt::format("{} mb {} stage {} [{:.4g}, {:.4g}]", name, iv.micro_batch, iv.stage, iv.start, iv.end));
        else
          s += xml_escape(fmt::format("{} [{:.4g}, {:.4g}]", name, iv.start, iv.end));
        s += "</title></rect>\n";
        if (compute) {
          const std::string label = schedule.virtual_stages > 1 && schedule.ranks > 0
                                        ? fmt::format("{}.{}", iv.micro_batch, iv.stage / schedule.ranks)
                                        : fmt::format("{}", iv.micro_batch);
          if (w >= 7.0 * static_cast<double>(label.size()) + 2.0)
            s += fmt::format(
                "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" dominant-baseline=\"middle\" "
                "fill=\"#ffffff\">{}</text>\n",
                x + w / 2, y + row_h / 2, xml_escape(label));
        }
      }
    }
    s += "</g>\n";
  }

  // Time axis.
  s += "<g class=\"axis\">\n";
  s += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#000000\"/>\n", x0,
                   rows_bottom, x0 + options.width, rows_bottom);
  const double step = tick_step(span, 10);
  for (int i = 0; i * step <= span * (1.0 + 1e-9); ++i) {
    const double t = i * step;
    const double x = x0 + t * scale;
    s += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"#000000\"/>\n", x,
                     rows_bottom, x, rows_bottom + 4.0);
    s += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">{:g}</text>\n", x, rows_bottom + 16.0, t);
  }
  s += fmt::format("<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"end\">time (s)</text>\n", x0 - 4.0,
                   rows_bottom + 16.0);
  s += "</g>\n";

  // Legend.
  s += "<g class=\"legend\">\n";
  double lx = x0;
  const double ly = rows_bottom + axis_h;
  // Weight gradients only where the schedule splits its backward (zero-bubble).
  bool split = false;
  for (const auto& tl : result.timelines)
    for (const Interval& iv : tl) split = split || iv.kind == IntervalKind::WeightGradient;
  std::vector<IntervalKind> legend{IntervalKind::Forward, IntervalKind::Backward};
  if (split) legend.push_back(IntervalKind::WeightGradient);
  for (IntervalKind k : {IntervalKind::Send, IntervalKind::RecvWait, IntervalKind::Update, IntervalKind::Idle})
    legend.push_back(k);
  for (IntervalKind k : legend) {
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\" stroke=\"#999999\"/>\n",
                     lx, ly, fill_of(k));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", lx + 16.0, ly + 10.0, xml_escape(legend_label(k)));
    lx += 110.0;
  }
  s += "</g>\n</svg>\n";
  return s;
}

}  // namespace shardwise::schedule
