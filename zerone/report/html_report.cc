#include "zerone/report/html_report.h"

#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "zerone/core/error.h"
#include "zerone/core/memory.h"
#include "zerone/io/file.h"
#include "zerone/report/svg_chart.h"

namespace zerone::report {

namespace {

using nlohmann::json;

std::string fmt(double v, const char* format) {
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt(n / 1e9, "%.2fG");
  if (n >= 1e6) return fmt(n / 1e6, "%.2fM");
  if (n >= 1e4) return fmt(n / 1e3, "%.1fk");
  return fmt(n, "%.0f");
}

std::string duration(double s) {
  if (s < 120) return fmt(s, "%.1f s");
  if (s < 7200) return fmt(s / 60, "%.1f min");
  return fmt(s / 3600, "%.2f h");
}

std::string utc_time(double unix_s) {
  const std::time_t t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[40];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

// A number field of a step object, or NaN.
double field(const json& step, const char* key) {
  auto it = step.find(key);
  return it != step.end() && it->is_number() ? it->get<double>() : std::nan("");
}

// (step, value) for every line that has `key`.
Series series_of(const RunLog& log, size_t index, const char* key, const std::string& metric, const char* x_key = "step",
                 double y_scale = 1.0) {
  Series s;
  s.run = log.name;
  s.metric = metric;
  s.color = run_color(index);
  for (const json& step : log.steps) {
    const double y = field(step, key), x = field(step, x_key);
    if (std::isnan(y) || std::isnan(x)) continue;
    s.x.push_back(x);
    s.y.push_back(y * y_scale);
  }
  return s;
}

std::string section(const std::string& title, const std::string& svg, const std::string& note = "") {
  if (svg.empty()) return "";
  return "<section><h2>" + escape_html(title) + "</h2>" + (note.empty() ? "" : "<p class=\"note\">" + escape_html(note) + "</p>") +
         svg + "</section>\n";
}

std::string setting(const json& run, const char* key) {
  auto it = run.find(key);
  if (it == run.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The header row of one run.
std::string run_header(const RunLog& log, size_t index) {
  const json& run = log.run.is_null() ? json::object() : log.run;
  const json& first = log.steps.front();
  const json& last = log.steps.back();
  const bool samples = log.classifier();
  const char* unit = samples ? "samples" : "tokens";
  double train_s = 0, flop_s = 0, tflop = 0;
  std::optional<double> best_val, final_val;
  int best_step = 0, skipped = 0;
  for (const json& s : log.steps) {
    const double ms = field(s, "ms");
    if (!std::isnan(ms)) train_s += ms / 1000;
    if (const double t = field(s, "tflop_per_s"); !std::isnan(t) && !std::isnan(ms)) {
      tflop += t * ms / 1000;
      flop_s += ms / 1000;
    }
    if (const double v = field(s, "val_loss"); !std::isnan(v)) {
      final_val = v;
      if (!best_val || v < *best_val) {
        best_val = v;
        best_step = s["step"].get<int>();
      }
    }
    if (s.contains("skipped")) ++skipped;
  }
  std::string rows;
  auto row = [&](const std::string& k, const std::string& v) {
    if (!v.empty()) rows += "<tr><th>" + escape_html(k) + "</th><td>" + escape_html(v) + "</td></tr>";
  };
  row("model", setting(run, "model") + (run.contains("parameters") ? " (" + human_count(run["parameters"].get<double>()) + " parameters)" : ""));
  row("precision", setting(run, "precision"));
  if (run.contains("micro_batch"))
    row("batch", "micro-batch " + setting(run, "micro_batch") + (run.contains("seq") ? " x seq " + setting(run, "seq") : "") +
                     " x accum " + setting(run, "grad_accum") + " x world " + setting(run, "world"));
  if (run.contains("zero_stage"))
    row("ZeRO", "stage " + setting(run, "zero_stage") + ", optimizer on " + setting(run, "offload_optimizer") + ", params on " +
                    setting(run, "offload_param"));
  if (run.contains("optimizer"))
    row("optimizer", setting(run, "optimizer") + ", lr " + setting(run, "lr") + " (" + setting(run, "lr_schedule") + ", warmup " +
                         setting(run, "warmup") + "), weight decay " + setting(run, "weight_decay") + ", grad clip " +
                         setting(run, "grad_clip"));
  row("data", setting(run, "data") + (run.contains("val_data") ? "; validation " + setting(run, "val_data") : ""));
  if (run.contains("host"))
    row("machine", setting(run, "host") + ": " + setting(run, "cpu") + ", " + setting(run, "threads_per_rank") + " threads per rank" +
                       (run.contains("comm") ? ", " + setting(run, "comm") : ""));
  const double end = field(last, "timestamp");
  double start = run.contains("start_time") && run["start_time"].is_number() ? run["start_time"].get<double>() : std::nan("");
  if (std::isnan(start)) start = field(first, "timestamp") - field(first, "elapsed_s");
  if (!std::isnan(start)) row("started", utc_time(start) + (run.contains("resumed_from_step") ? ", resumed from step " + setting(run, "resumed_from_step") : ""));
  std::string dur = "steps " + first["step"].dump() + ".." + last["step"].dump() + ", training " + duration(train_s);
  if (!std::isnan(end) && !std::isnan(start)) dur += " of " + duration(end - start) + " wall";
  row("duration", dur);
  const double seen = field(last, unit);
  if (!std::isnan(seen))
    row(unit, human_count(seen) + " seen, " + human_count(train_s > 0 ? (seen - (field(first, unit) - field(first, samples ? "samples_per_s" : "tokens_per_s") * field(first, "ms") / 1000)) / train_s : 0) +
                  " " + unit + "/s on average");
  if (flop_s > 0) {
    std::string t = fmt(tflop / flop_s, "%.3f") + " TFLOP/s";
    if (run.contains("peak_tflop_per_s") && run["peak_tflop_per_s"].is_number()) {
      const double peak = run["peak_tflop_per_s"].get<double>();
      const double world = run.contains("world") && run["world"].is_number() ? run["world"].get<double>() : 1.0;
      t += ", MFU " + fmt(100 * tflop / flop_s / (world * peak), "%.1f") + "% of " + fmt(peak, "%.3f") + " TFLOP/s per rank (" +
           setting(run, "peak_source") + ")";
    }
    row("throughput", t);
  }
  std::string loss = "final training " + fmt(last["loss"].get<double>(), "%.4f");
  if (final_val) loss += ", final validation " + fmt(*final_val, "%.4f") + ", best validation " + fmt(*best_val, "%.4f") + " (step " + std::to_string(best_step) + ")";
  if (const double acc = field(last, "val_accuracy"); !std::isnan(acc)) loss += ", validation accuracy " + fmt(100 * acc, "%.2f") + "%";
  if (skipped > 0) loss += ", " + std::to_string(skipped) + " steps skipped (fp16 overflow)";
  row("loss", loss);
  if (last.contains("mem") && last["mem"].is_object() && last["mem"].contains("peak_rss"))
    row("peak RSS", human_bytes(last["mem"]["peak_rss"].get<double>()));
  if (log.partial_lines > 0) row("note", "the last line is incomplete (a run still being written) and was left out");
  std::string out = "<div class=\"run\"><h3><span class=\"swatch\" style=\"background:" + run_color(index) + "\"></span>" +
                    escape_html(log.name) + " <small>" + escape_html(log.path) + "</small></h3><table>" + rows + "</table>";
  if (!log.run.is_null()) out += "<details><summary>all settings</summary><pre>" + escape_html(log.run.dump(2)) + "</pre></details>";
  return out + "</div>\n";
}

// Memory per "place.category" over the steps of one run, stacked (peak_rss is not a category).
std::string memory_chart(const RunLog& log, size_t index) {
  std::vector<std::string> keys;
  for (const json& s : log.steps)
    if (s.contains("mem") && s["mem"].is_object())
      for (const auto& [k, v] : s["mem"].items())
        if (k != "peak_rss" && std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  if (keys.empty()) return "";
  std::vector<double> x;
  std::vector<Series> layers(keys.size());
  for (size_t k = 0; k < keys.size(); ++k) {
    layers[k].run = log.name;
    layers[k].metric = keys[k];
    layers[k].color = run_color(k + 1 + index);
  }
  for (const json& s : log.steps) {
    x.push_back(s["step"].get<double>());
    for (size_t k = 0; k < keys.size(); ++k) {
      double bytes = 0;
      if (s.contains("mem") && s["mem"].is_object() && s["mem"].contains(keys[k]) && s["mem"][keys[k]].is_number())
        bytes = s["mem"][keys[k]].get<double>();
      layers[k].y.push_back(bytes / (1024.0 * 1024.0));
    }
  }
  return stacked_area_svg({"memory-" + std::to_string(index), "memory of " + log.name + " (rank 0) by place.category", "step", "MiB"},
                          x, layers);
}

const char* kStyle = R"(body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:16px;margin:18px 0 4px}h3{font-size:15px;margin:10px 0 4px}small{color:#777;font-weight:normal}
table{border-collapse:collapse}th,td{text-align:left;padding:2px 10px 2px 0;vertical-align:top}th{color:#555;font-weight:normal}
.run{margin-bottom:14px}.swatch{display:inline-block;width:12px;height:12px;margin-right:6px}
.charts{display:flex;flex-wrap:wrap;gap:8px}section{flex:0 0 auto}.note{color:#666;margin:0}
svg.chart{width:640px;height:auto}svg.chart text{font:11px system-ui,sans-serif;fill:#333}svg.chart .title{font-size:13px;font-weight:600}
svg.chart .grid{stroke:#e6e6e6}svg.chart .axes{fill:none;stroke:#999}svg.chart .readout{fill:#000;font-weight:600}
pre{background:#f6f6f6;padding:6px;font-size:12px})";

// Hover readout: the value of each series at the step under the pointer, read back from the
// points through the plot's mapping (Note [Chart geometry]).
const char* kScript = R"(
(function () {
  function parse(poly) {
    return poly.getAttribute('points').trim().split(/\s+/).filter(Boolean).map(function (p) {
      var xy = p.split(','); return [parseFloat(xy[0]), parseFloat(xy[1])];
    });
  }
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var plot = svg.querySelector('g.plot'), out = svg.querySelector('text.readout');
    if (!plot || !out) return;
    var d = function (k) { return parseFloat(plot.getAttribute('data-' + k)); };
    var logY = plot.getAttribute('data-log-y') === '1';
    var lines = Array.prototype.map.call(plot.querySelectorAll('polyline'), function (p) {
      return { name: p.getAttribute('data-run') + ' ' + p.getAttribute('data-metric'), pts: parse(p) };
    });
    svg.addEventListener('mousemove', function (ev) {
      var box = svg.getBoundingClientRect();
      var px = (ev.clientX - box.left) * (svg.viewBox.baseVal.width / box.width);
      var x = d('x-min') + (px - d('left')) / (d('right') - d('left')) * (d('x-max') - d('x-min'));
      var parts = [];
      lines.forEach(function (l) {
        var best = null;
        l.pts.forEach(function (p) { if (best === null || Math.abs(p[0] - px) < Math.abs(best[0] - px)) best = p; });
        if (best === null) return;
        var v = d('y-min') + (d('bottom') - best[1]) / (d('bottom') - d('top')) * (d('y-max') - d('y-min'));
        if (logY) v = Math.pow(10, v);
        parts.push(l.name + ' ' + v.toPrecision(4));
      });
      out.textContent = 'x ' + x.toPrecision(5) + ': ' + parts.join(', ');
    });
    svg.addEventListener('mouseleave', function () { out.textContent = ''; });
  });
})();
)";

}  // namespace

std::string render_html_report(const std::vector<RunLog>& runs) {
  ZERONE_CHECK(!runs.empty(), "zerone report needs at least one metrics file");
  const bool samples = runs.front().classifier();
  const char* unit = samples ? "samples" : "tokens";
  std::string names;
  for (const RunLog& r : runs) names += (names.empty() ? "" : ", ") + r.name;
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>zerone report: " + escape_html(names) +
                     "</title><style>" + kStyle + "</style></head><body>\n<h1>zerone report: " + escape_html(names) + "</h1>\n";
  for (size_t i = 0; i < runs.size(); ++i) html += run_header(runs[i], i);

  auto per_run = [&](const char* key, const std::string& metric, const char* x_key = "step", double scale = 1.0) {
    std::vector<Series> out;
    for (size_t i = 0; i < runs.size(); ++i) {
      Series s = series_of(runs[i], i, key, metric, x_key, scale);
      if (!s.y.empty()) out.push_back(std::move(s));
    }
    return out;
  };
  auto with_validation = [&](const char* x_key) {
    std::vector<Series> out = per_run("loss", "loss", x_key);
    for (Series& v : per_run("val_loss", "val_loss", x_key)) {
      v.dashed = true;
      v.markers = true;
      out.push_back(std::move(v));
    }
    return out;
  };
  html += "<div class=\"charts\">\n";
  html += section("Loss against step", line_chart_svg({"loss-step", "loss (validation dashed)", "step", "loss"}, with_validation("step")));
  html += section(std::string("Loss against ") + unit,
                  line_chart_svg({"loss-tokens", std::string("loss against ") + unit + " seen", std::string(unit) + " seen", "loss"},
                                 with_validation(unit)));
  html += section("Learning rate", line_chart_svg({"lr", "learning rate", "step", "lr"}, per_run("lr", "lr")));
  html += section("Gradient norm", line_chart_svg({"grad-norm", "gradient norm (before clipping)", "step", "norm"}, per_run("grad_norm", "grad_norm")));
  const char* rate_key = samples ? "samples_per_s" : "tokens_per_s";
  html += section("Throughput", line_chart_svg({"throughput", std::string(unit) + " per second", "step", std::string(unit) + "/s"},
                                               per_run(rate_key, rate_key)));
  html += section("Model TFLOP/s", line_chart_svg({"tflops", "model TFLOP/s (all ranks)", "step", "TFLOP/s"}, per_run("tflop_per_s", "tflop_per_s")));
  html += section("MFU", line_chart_svg({"mfu", "model FLOPs utilization", "step", "MFU %"}, per_run("mfu", "mfu", "step", 100.0)));
  std::vector<Series> scale = per_run("loss_scale", "loss_scale");
  if (!scale.empty()) {
    for (size_t i = 0; i < runs.size(); ++i) {
      Series skipped;
      skipped.run = runs[i].name;
      skipped.metric = "skipped";
      skipped.color = run_color(i);
      skipped.markers = true;
      for (const json& s : runs[i].steps)
        if (s.contains("skipped") && !std::isnan(field(s, "loss_scale"))) {
          skipped.x.push_back(s["step"].get<double>());
          skipped.y.push_back(field(s, "loss_scale"));
        }
      if (!skipped.y.empty()) scale.push_back(std::move(skipped));
    }
    html += section("fp16 loss scale", line_chart_svg({"loss-scale", "loss scale (dots: skipped steps)", "step", "scale", true}, scale));
  }
  for (size_t i = 0; i < runs.size(); ++i) html += section("Memory of " + runs[i].name, memory_chart(runs[i], i));
  html += "</div>\n<script>" + std::string(kScript) + "</script>\n</body></html>\n";
  return html;
}

void write_html_report(const std::vector<RunLog>& runs, const std::string& out) {
  io::check_atomic_output(out, "-o");
  for (const RunLog& r : runs)
    ZERONE_CHECK(!io::same_file(r.path, out), "-o '", out, "' is the metrics file '", r.path, "': the report would replace it");
  const std::string html = render_html_report(runs);
  io::write_file_atomically(out, [&](std::FILE* f) {
    ZERONE_CHECK(std::fwrite(html.data(), 1, html.size(), f) == html.size(), "cannot write '", out, "'");
  });
}

}  // namespace zerone::report
