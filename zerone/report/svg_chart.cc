#include "zerone/report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace zerone::report {

namespace {

constexpr double kWidth = 720, kHeight = 300;
constexpr double kLeft = 78, kRight = 700, kTop = 34, kBottom = 252;

std::string num(double v, const char* format = "%.2f") {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

// A tick label: 4 significant digits, no trailing noise.
std::string tick_label(double v) {
  if (v == 0) return "0";
  return num(v, "%.4g");
}

// Ticks at 1, 2 or 5 x 10^k covering [lo, hi], about five of them.
std::vector<double> nice_ticks(double lo, double hi) {
  std::vector<double> ticks;
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

struct Mapping {
  double x_min, x_max, y_min, y_max;
  bool log_y;
  double px(double x) const { return kLeft + (x - x_min) / (x_max - x_min) * (kRight - kLeft); }
  double py(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return kBottom - (v - y_min) / (y_max - y_min) * (kBottom - kTop);
  }
};

// Indices of the points to draw: all, or the min and max of each bucket (Note [Chart geometry]).
std::vector<size_t> thin(const std::vector<double>& y) {
  std::vector<size_t> keep;
  if (y.size() <= kMaxPoints) {
    for (size_t i = 0; i < y.size(); ++i) keep.push_back(i);
    return keep;
  }
  const size_t buckets = kMaxPoints / 2;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = b * y.size() / buckets, end = (b + 1) * y.size() / buckets;
    if (begin >= end) continue;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (y[i] < y[lo]) lo = i;
      if (y[i] > y[hi]) hi = i;
    }
    keep.push_back(std::min(lo, hi));
    if (lo != hi) keep.push_back(std::max(lo, hi));
  }
  return keep;
}

bool usable(double y, bool log_y) { return std::isfinite(y) && (!log_y || y > 0); }

std::string frame(const ChartSpec& spec, const Mapping& m, const std::vector<std::string>& legend_names,
                  const std::vector<std::string>& legend_colors, const std::string& body) {
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"" + escape_html(spec.id) +
                    "\" viewBox=\"0 0 " + num(kWidth, "%.0f") + " " + num(kHeight, "%.0f") + "\" width=\"" +
                    num(kWidth, "%.0f") + "\" height=\"" + num(kHeight, "%.0f") + "\">\n";
  svg += "<text class=\"title\" x=\"" + num(kLeft) + "\" y=\"20\">" + escape_html(spec.title) + "</text>\n";
  // Axes and grid.
  std::string axes;
  for (double t : nice_ticks(m.x_min, m.x_max)) {
    const double x = m.px(t);
    axes += "<line class=\"grid\" x1=\"" + num(x) + "\" y1=\"" + num(kTop) + "\" x2=\"" + num(x) + "\" y2=\"" + num(kBottom) + "\"/>";
    axes += "<text class=\"tick\" x=\"" + num(x) + "\" y=\"" + num(kBottom + 16) + "\" text-anchor=\"middle\">" + tick_label(t) + "</text>\n";
  }
  for (double t : nice_ticks(m.y_min, m.y_max)) {
    const double y = kBottom - (t - m.y_min) / (m.y_max - m.y_min) * (kBottom - kTop);
    axes += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kRight) + "\" y2=\"" + num(y) + "\"/>";
    axes += "<text class=\"tick\" x=\"" + num(kLeft - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
            (m.log_y ? tick_label(std::pow(10.0, t)) : tick_label(t)) + "</text>\n";
  }
  svg += axes;
  svg += "<rect class=\"axes\" x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kRight - kLeft) +
         "\" height=\"" + num(kBottom - kTop) + "\"/>\n";
  svg += "<text class=\"label\" x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num(kHeight - 12) + "\" text-anchor=\"middle\">" +
         escape_html(spec.x_label) + "</text>\n";
  svg += "<text class=\"label\" transform=\"translate(16 " + num((kTop + kBottom) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         escape_html(spec.y_label) + (spec.log_y ? " (log scale)" : "") + "</text>\n";
  svg += "<g class=\"plot\" data-x-min=\"" + num(m.x_min, "%.17g") + "\" data-x-max=\"" + num(m.x_max, "%.17g") +
         "\" data-y-min=\"" + num(m.y_min, "%.17g") + "\" data-y-max=\"" + num(m.y_max, "%.17g") + "\" data-left=\"" +
         num(kLeft) + "\" data-right=\"" + num(kRight) + "\" data-top=\"" + num(kTop) + "\" data-bottom=\"" + num(kBottom) +
         "\" data-log-y=\"" + (m.log_y ? "1" : "0") + "\">\n" + body + "</g>\n";
  // Legend, right-aligned above the plot.
  double x = kRight;
  for (size_t i = legend_names.size(); i-- > 0;) {
    const std::string& name = legend_names[i];
    x -= 14 + 7.0 * static_cast<double>(name.size()) + 16;
    svg += "<rect class=\"swatch\" x=\"" + num(x) + "\" y=\"11\" width=\"12\" height=\"10\" fill=\"" + legend_colors[i] + "\"/>";
    svg += "<text class=\"legend\" x=\"" + num(x + 16) + "\" y=\"20\">" + escape_html(name) + "</text>\n";
  }
  svg += "<text class=\"readout\" x=\"" + num(kLeft + 6) + "\" y=\"" + num(kTop + 14) + "\"></text>\n";
  return svg + "</svg>\n";
}

std::string polyline(const Series& s, const Mapping& m, const char* cls, const std::vector<size_t>& keep, bool thinned) {
  std::string points;
  for (size_t i : keep) {
    if (!usable(s.y[i], m.log_y)) continue;
    points += (points.empty() ? "" : " ") + num(m.px(s.x[i])) + "," + num(m.py(s.y[i]));
  }
  std::string out = std::string("<polyline class=\"") + cls + "\" data-run=\"" + escape_html(s.run) + "\" data-metric=\"" +
                    escape_html(s.metric) + "\"" + (thinned ? " data-thinned=\"1\"" : "") + " fill=\"none\" stroke=\"" +
                    s.color + "\" stroke-width=\"1.5\"" + (s.dashed ? " stroke-dasharray=\"5 3\"" : "") +
                    (s.markers && keep.size() == 1 ? " stroke-linecap=\"round\"" : "") + " points=\"" + points + "\"><title>" +
                    escape_html(s.run + " " + s.metric) + "</title></polyline>\n";
  if (s.markers)
    for (size_t i : keep)
      if (usable(s.y[i], m.log_y))
        out += "<circle class=\"marker\" data-run=\"" + escape_html(s.run) + "\" data-metric=\"" + escape_html(s.metric) +
               "\" cx=\"" + num(m.px(s.x[i])) + "\" cy=\"" + num(m.py(s.y[i])) + "\" r=\"2.5\" fill=\"" + s.color + "\"/>";
  return out;
}

Mapping domain(const std::vector<const std::vector<double>*>& xs, const std::vector<const std::vector<double>*>& ys,
               bool log_y, bool from_zero) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (size_t k = 0; k < xs.size(); ++k)
    for (size_t i = 0; i < ys[k]->size(); ++i) {
      const double y = (*ys[k])[i];
      if (!usable(y, log_y)) continue;
      x_lo = std::min(x_lo, (*xs[k])[i]);
      x_hi = std::max(x_hi, (*xs[k])[i]);
      const double v = log_y ? std::log10(y) : y;
      y_lo = std::min(y_lo, v);
      y_hi = std::max(y_hi, v);
    }
  if (from_zero) y_lo = std::min(y_lo, 0.0);
  if (!(x_hi > x_lo)) {
    x_lo -= 1;
    x_hi += 1;
  }
  if (!(y_hi > y_lo)) {
    const double pad = y_lo == 0 ? 1 : std::abs(y_lo) * 0.1;
    y_lo -= pad;
    y_hi += pad;
  } else {
    const double pad = (y_hi - y_lo) * 0.05;
    if (!(from_zero && y_lo == 0)) y_lo -= pad;
    y_hi += pad;
  }
  return Mapping{x_lo, x_hi, y_lo, y_hi, log_y};
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string run_color(size_t i) {
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  return colors[i % (sizeof colors / sizeof colors[0])];
}

std::string line_chart_svg(const ChartSpec& spec, const std::vector<Series>& series) {
  std::vector<const std::vector<double>*> xs, ys;
  bool any = false;
  for (const Series& s : series) {
    xs.push_back(&s.x);
    ys.push_back(&s.y);
    for (double y : s.y) any = any || usable(y, spec.log_y);
  }
  if (!any) return "";
  const Mapping m = domain(xs, ys, spec.log_y, false);
  std::string body;
  std::vector<std::string> names, colors;
  for (const Series& s : series) {
    const std::vector<size_t> keep = thin(s.y);
    body += polyline(s, m, "series", keep, keep.size() != s.y.size());
    if (std::find(names.begin(), names.end(), s.run) == names.end()) {
      names.push_back(s.run);
      colors.push_back(s.color);
    }
  }
  return frame(spec, m, names, colors, body);
}

std::string stacked_area_svg(const ChartSpec& spec, const std::vector<double>& x, const std::vector<Series>& layers) {
  if (layers.empty() || x.empty()) return "";
  std::vector<Series> totals;
  std::vector<double> running(x.size(), 0.0);
  for (const Series& layer : layers) {
    Series t = layer;
    t.x = x;
    for (size_t i = 0; i < x.size(); ++i) running[i] += i < layer.y.size() && std::isfinite(layer.y[i]) ? layer.y[i] : 0.0;
    t.y = running;
    totals.push_back(std::move(t));
  }
  std::vector<const std::vector<double>*> xs, ys;
  for (const Series& t : totals) {
    xs.push_back(&t.x);
    ys.push_back(&t.y);
  }
  const Mapping m = domain(xs, ys, false, true);
  std::string body;
  std::vector<std::string> names, colors;
  // Each band is the polygon between this layer's total and the one below, drawn under its line.
  const std::vector<size_t> keep = thin(totals.back().y);
  for (size_t l = 0; l < totals.size(); ++l) {
    std::string band;
    for (size_t i : keep) band += num(m.px(x[i])) + "," + num(m.py(totals[l].y[i])) + " ";
    for (size_t k = keep.size(); k-- > 0;) {
      const size_t i = keep[k];
      band += num(m.px(x[i])) + "," + num(m.py(l == 0 ? 0.0 : totals[l - 1].y[i])) + " ";
    }
    body += "<polygon class=\"band\" fill=\"" + totals[l].color + "\" fill-opacity=\"0.55\" stroke=\"none\" points=\"" + band + "\"/>\n";
    body += polyline(totals[l], m, "layer", keep, keep.size() != x.size());
    names.push_back(totals[l].metric);
    colors.push_back(totals[l].color);
  }
  return frame(spec, m, names, colors, body);
}

}  // namespace zerone::report
