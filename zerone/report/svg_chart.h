// SVG line charts and stacked area charts for `zerone report`: plain text, no script, no network.
//
// Note [Chart geometry]: every chart is an <svg> whose plot area is a <g class="plot"> carrying
// its data-to-pixel mapping as attributes (data-x-min, data-x-max, data-y-min, data-y-max: the
// domain; data-left, data-right, data-top, data-bottom: the pixels; data-log-y="1": y is log10).
// Each series is a <polyline class="series" data-run=".." data-metric=".." points="x,y ...">
// with pixel coordinates printed to 0.01 px, so a reader (the report's hover script, the tests)
// can map every point back to its value. A series longer than kMaxPoints is thinned to the
// smallest and largest value of each of kMaxPoints/2 buckets (data-thinned="1"); shorter ones have
// one point per value, in order.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

namespace zerone::report {

constexpr size_t kMaxPoints = 4000;

struct Series {
  std::string run;      // legend name
  std::string metric;   // what is plotted ("loss", "val_loss", ...)
  std::vector<double> x, y;
  std::string color;    // CSS colour
  bool dashed = false;
  bool markers = false;  // a dot at each point (sparse series: validation, skipped steps)
};

struct ChartSpec {
  std::string id;       // the svg's id
  std::string title, x_label, y_label;
  bool log_y = false;   // values <= 0 are left out
};

// One chart of every series; empty string when no series has a point.
std::string line_chart_svg(const ChartSpec& spec, const std::vector<Series>& series);

// Areas stacked bottom-up in the order given (each layer's polyline is the running total, class
// "layer"), over the shared x.
std::string stacked_area_svg(const ChartSpec& spec, const std::vector<double>& x, const std::vector<Series>& layers);

// The colour of run i in every chart.
std::string run_color(size_t i);

// Text escaped for HTML/SVG content and attributes.
std::string escape_html(const std::string& text);

}  // namespace zerone::report
