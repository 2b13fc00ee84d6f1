// `zerone report`: one self-contained HTML file (inline SVG and one inline script for a hover
// readout; nothing fetched) from the metrics JSONL of one or more runs, overlaid by name.
//
// Sections: a header per run (settings, machine, duration, tokens, throughput, MFU, losses); loss
// against step and against tokens (validation dashed with dots); learning rate; gradient norm;
// throughput; TFLOP/s and MFU; memory per place and category, stacked, one chart per run; fp16 loss
// scale with the skipped steps. Charts whose fields no run has are left out. Chart geometry:
// Note [Chart geometry] in svg_chart.h.
// Failure: Error naming the output (-o) when it cannot be written; the file is written atomically.
// Thread-safety: pure apart from the file it writes.
#pragma once

#include <string>
#include <vector>

#include "zerone/report/run_log.h"

namespace zerone::report {

// The HTML text of the report.
std::string render_html_report(const std::vector<RunLog>& runs);

// Checks `out` (check_atomic_output, and not one of the inputs), renders and writes it atomically.
void write_html_report(const std::vector<RunLog>& runs, const std::string& out);

}  // namespace zerone::report
