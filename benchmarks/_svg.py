"""A small log-log line chart written as SVG by hand (matplotlib is not a dependency)."""
from __future__ import annotations

import math
from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]


def _decades(lo: float, hi: float) -> tuple[float, float]:
    return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))


def _fmt(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:g}"
    return f"{v:g}"


class Panel:
    """One chart: series of (x, y) points on log axes. `x_ticks`: the x values to label
    (None: decades); y is labelled at decades and 2x, 5x between them when few decades."""

    def __init__(self, title: str, x_label: str, y_label: str, x_ticks: list[float] | None = None):
        self.title, self.x_label, self.y_label, self.x_ticks = title, x_label, y_label, x_ticks
        self.series: list[dict] = []

    def add(self, label: str, points: list[tuple[float, float]], color: str, dashed: bool = False,
            marker: str = "circle", line: bool = True, markers: bool = True) -> None:
        """`line` False: the points alone (a scatter); `markers` False: the line alone."""
        points = [(x, y) for x, y in points if x > 0 and y > 0]
        if points:
            self.series.append({"label": label, "points": sorted(points), "color": color, "dashed": dashed,
                                "marker": marker, "line": line, "markers": markers})

    def _svg(self, left: float, top: float, width: float, height: float) -> list[str]:
        xs = [x for s in self.series for x, _ in s["points"]]
        ys = [y for s in self.series for _, y in s["points"]]
        if not xs:
            return []
        x0, x1 = min(xs), max(xs)
        if self.x_ticks is None:
            x0, x1 = _decades(x0, x1)
        else:
            x0, x1 = x0 / 1.25, x1 * 1.25
        y0, y1 = _decades(min(ys), max(ys))
        pl, pr, pt, pb = 58, 12, 30, 46  # plot area margins inside the panel
        w, h = width - pl - pr, height - pt - pb

        def px(x: float) -> float:
            return left + pl + w * (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))

        def py(y: float) -> float:
            return top + pt + h * (1 - (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)))

        out = [f'<text x="{left + pl + w / 2:.1f}" y="{top + 18:.1f}" text-anchor="middle" '
               f'font-size="14" font-weight="bold">{escape(self.title)}</text>',
               f'<rect x="{left + pl:.1f}" y="{top + pt:.1f}" width="{w:.1f}" height="{h:.1f}" fill="none" '
               f'stroke="#444" stroke-width="1"/>']
        # y grid: decades, plus 2 and 5 when the axis spans at most three decades
        decades = round(math.log10(y1 / y0))
        yticks = []
        for k in range(decades + 1):
            base = y0 * 10 ** k
            yticks.append((base, True))
            if decades <= 3 and k < decades:
                yticks += [(2 * base, False), (5 * base, False)]
        for y, major in yticks:
            yy = py(y)
            out.append(f'<line x1="{left + pl:.1f}" y1="{yy:.1f}" x2="{left + pl + w:.1f}" y2="{yy:.1f}" '
                       f'stroke="{"#ccc" if major else "#eee"}" stroke-width="1"/>')
            out.append(f'<text x="{left + pl - 6:.1f}" y="{yy + 4:.1f}" text-anchor="end" font-size="11">'
                       f'{_fmt(y)}</text>')
        if self.x_ticks is None:
            xticks = [x0 * 10 ** k for k in range(round(math.log10(x1 / x0)) + 1)]
        else:
            xticks = self.x_ticks
        for x in xticks:
            xx = px(x)
            out.append(f'<line x1="{xx:.1f}" y1="{top + pt:.1f}" x2="{xx:.1f}" y2="{top + pt + h:.1f}" '
                       f'stroke="#ddd" stroke-width="1"/>')
            out.append(f'<text x="{xx:.1f}" y="{top + pt + h + 16:.1f}" text-anchor="middle" font-size="11">'
                       f'{_fmt(x)}</text>')
        out.append(f'<text x="{left + pl + w / 2:.1f}" y="{top + height - 8:.1f}" text-anchor="middle" '
                   f'font-size="12">{escape(self.x_label)}</text>')
        cy = top + pt + h / 2
        out.append(f'<text x="{left + 14:.1f}" y="{cy:.1f}" text-anchor="middle" font-size="12" '
                   f'transform="rotate(-90 {left + 14:.1f} {cy:.1f})">{escape(self.y_label)}</text>')
        for s in self.series:
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s["points"])
            dash = ' stroke-dasharray="6 4"' if s["dashed"] else ""
            if s["line"]:
                out.append(f'<polyline points="{pts}" fill="none" stroke="{s["color"]}" stroke-width="2"{dash}>'
                           f'<title>{escape(s["label"])}</title></polyline>')
            if not s["markers"]:
                continue
            for x, y in s["points"]:
                tip = f"<title>{escape(s['label'])}: {_fmt(x)} -> {y:.3g}</title>"
                if s["marker"] == "square":
                    out.append(f'<rect x="{px(x) - 3.5:.1f}" y="{py(y) - 3.5:.1f}" width="7" height="7" '
                               f'fill="white" stroke="{s["color"]}" stroke-width="1.5">{tip}</rect>')
                else:
                    out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{s["color"]}">{tip}</circle>')
        return out


def write_chart(path: str, panels: list[Panel], legend: list[tuple[str, str, bool, str]], caption: str,
                panel_width: float = 460, panel_height: float = 340) -> str:
    """Panels side by side, one shared legend below them in two rows, filled column by column
    ((label, color, dashed, marker) each),
    a caption line at the bottom. Returns the SVG text (also written to `path`)."""
    legend_rows = 2  # column-major: each column a pair (e.g. fast, thorough)
    cols = max(1, math.ceil(len(legend) / legend_rows))
    width = panel_width * len(panels) + 20
    height = panel_height + 20 + 20 * legend_rows + 30
    body = [f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="white"/>']
    for i, panel in enumerate(panels):
        body += panel._svg(10 + i * panel_width, 6, panel_width, panel_height)
    col_w = (width - 40) / cols
    for i, (label, color, dashed, marker) in enumerate(legend):
        x = 20 + (i // legend_rows) * col_w
        y = panel_height + 26 + 20 * (i % legend_rows)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        body.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x + 28:.1f}" y2="{y:.1f}" stroke="{color}" '
                    f'stroke-width="2"{dash}/>')
        if marker == "square":
            body.append(f'<rect x="{x + 10.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" fill="white" '
                        f'stroke="{color}" stroke-width="1.5"/>')
        else:
            body.append(f'<circle cx="{x + 14:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')
        body.append(f'<text x="{x + 36:.1f}" y="{y + 4:.1f}" font-size="12">{escape(label)}</text>')
    body.append(f'<text x="{width / 2:.1f}" y="{height - 10:.1f}" text-anchor="middle" font-size="11" '
                f'fill="#555">{escape(caption)}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif">\n'
           + "\n".join(body) + "\n</svg>\n")
    with open(path, "w") as f:
        f.write(svg)
    return svg
