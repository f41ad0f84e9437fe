#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "core/strings.h"

namespace tessera::sim {

namespace {

std::string Fixed(double v, int digits) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string SeedList(const std::vector<uint64_t>& seeds) {
  if (seeds.empty()) return "";
  bool consecutive = true;
  for (size_t i = 1; i < seeds.size(); ++i) consecutive = consecutive && seeds[i] == seeds[i - 1] + 1;
  if (consecutive && seeds.size() > 2) return StrCat(seeds.front(), "-", seeds.back());
  std::vector<std::string> s;
  for (uint64_t x : seeds) s.push_back(StrCat(x));
  return StrJoin(s, ",");
}

void AppendRow(std::string& out, const std::vector<std::string>& cells, const std::vector<size_t>& width) {
  for (size_t c = 0; c < cells.size(); ++c) {
    out += cells[c];
    if (c + 1 < cells.size()) out.append(width[c] - std::min(width[c], cells[c].size()) + 2, ' ');
  }
  out += "\n";
}

}  // namespace

namespace {

struct BoundSummary {
  double offline_mean = 0, offline_se = 0, floor_mean = 0, floor_se = 0;
  bool grouped = false;  // some seed's share sizes were grouped (sim/bound.h)
  double slack_max = 0;  // then the largest distance to the restricted LP; NaN where one was infeasible
};

// Mean and standard error over the seeds.
std::pair<double, double> MeanSe(const std::vector<double>& xs) {
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  if (xs.size() < 2) return {mean, 0.0};
  double var = 0;
  for (double x : xs) var += (x - mean) * (x - mean);
  var /= static_cast<double>(xs.size() - 1);
  return {mean, std::sqrt(var / static_cast<double>(xs.size()))};
}

BoundSummary SummarizeBounds(const std::vector<SeedBound>& bounds) {
  std::vector<double> offline;
  std::vector<double> floor;
  BoundSummary b;
  for (const SeedBound& s : bounds) {
    offline.push_back(s.offline.unallocated_pct);
    floor.push_back(s.online_floor.unallocated_pct);
    for (const Bound* one : {&s.offline, &s.online_floor}) {
      if (!one->share_sizes_grouped) continue;
      b.grouped = true;
      b.slack_max = std::isnan(one->grouping_slack_pct) || std::isnan(b.slack_max)
                        ? NAN
                        : std::max(b.slack_max, one->grouping_slack_pct);
    }
  }
  std::tie(b.offline_mean, b.offline_se) = MeanSe(offline);
  std::tie(b.floor_mean, b.floor_se) = MeanSe(floor);
  return b;
}

bool ShowPriorities(const ReportInfo& info, const std::vector<PolicySummary>& summaries) {
  return !info.high_priority_qos.empty() ||
         std::any_of(summaries.begin(), summaries.end(),
                     [](const PolicySummary& s) { return s.has_priorities(); });
}

std::string PriorityLine(const ReportInfo& info) {
  return StrCat(info.high_priority_qos.empty()
                    ? std::string("high priority as the workload file gives it")
                    : StrCat("qos ", StrJoin(info.high_priority_qos, ","), " high, the rest low"),
                "; compression ", info.compression ? "on" : "off", "; shares' GPU memory ",
                info.share_memory_none ? "none (compute only)" : "proportional");
}

}  // namespace

std::string FormatTable(const ReportInfo& info, const std::vector<PolicySummary>& summaries) {
  std::string out =
      StrCat("Cluster:  ", info.nodes, " (", info.node_count, " nodes, ", info.gpu_count, " GPUs)\n",
             "Workload: ", info.pods, " (", info.pod_count, " pods), scaled to ",
             Fixed(100 * info.inflate, 0), "% of GPU capacity\n", "Seeds:    ", SeedList(info.seeds), "\n");
  const bool priorities = ShowPriorities(info, summaries);
  if (priorities) out += StrCat("Priority: ", PriorityLine(info), "\n");
  out += "\n";
  std::vector<std::vector<std::string>> rows = {{"POLICY", "UNALLOCATED@100%", "UNALLOCATED@130%",
                                                 "FRAG@100%", "PLACED", "FAILED BY SHAPE", "FAILED BY CAUSE",
                                                 "SEC/RUN"}};
  for (const PolicySummary& s : summaries) {
    std::vector<std::string> failed;
    for (const auto& [shape, n] : s.failed_by_shape) failed.push_back(StrCat(shape, " ", Fixed(n, 0)));
    std::vector<std::string> causes;
    for (const auto& [cause, n] : s.failed_by_cause) causes.push_back(StrCat(cause, " ", Fixed(n, 0)));
    const double frag100 = s.mean.frag_ratio_pct.size() > 100 ? s.mean.frag_ratio_pct[100] : NAN;
    rows.push_back(
        {s.policy,
         StrCat(Fixed(s.Mean100(), 2), s.seeds.size() > 1 ? StrCat(" ± ", Fixed(s.Std100(), 2)) : ""),
         Fixed(s.Mean130(), 2), StrCat(Fixed(frag100, 1), "%"),
         StrCat(Fixed(s.placed, 0), "/", Fixed(s.pods, 0)), failed.empty() ? "-" : StrJoin(failed, ", "),
         causes.empty() ? "-" : StrJoin(causes, ", "), Fixed(s.seconds, 2)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) AppendRow(out, r, width);
  if (!info.bounds.empty()) {
    const BoundSummary b = SummarizeBounds(info.bounds);
    out += StrCat("\nBOUND@100%: no placement leaves less than ", Fixed(b.offline_mean, 2), " ± ",
                  Fixed(b.offline_se, 2),
                  "% unallocated (LP relaxation); an online one, which must place every pod ",
                  "arriving before 95%, no less than ", Fixed(b.floor_mean, 2), " ± ", Fixed(b.floor_se, 2),
                  "% (mean ± standard error over the seeds).\n");
    if (b.grouped) {
      out += StrCat(
          "The pods' shares take too many sizes for the exact LP: each was rounded down to its group's ",
          "smallest (still a bound); rounded up instead, the LP leaves at most ",
          std::isnan(b.slack_max) ? std::string("an unknown amount (a forced pod did not fit)")
                                  : StrCat(Fixed(b.slack_max, 2), " points"),
          " more, so the exact LP's bound is within that of the one shown.\n");
    }
  }
  if (priorities) {
    out += "\n";
    std::vector<std::vector<std::string>> prio = {{"POLICY", "SEED", "HIGH PODS", "HIGH PLACED",
                                                   "HIGH UNPLACED", "BY COMPRESSION", "COMPRESSED TENANTS",
                                                   "SHARE GIVEN UP"}};
    for (const PolicySummary& s : summaries) {
      for (size_t i = 0; i < s.priority.size(); ++i) {
        const PriorityCounts& c = s.priority[i];
        prio.push_back({s.policy, StrCat(s.seeds[i]), StrCat(c.high_pods), StrCat(c.high_placed),
                        StrCat(c.high_unplaced()), StrCat(c.placed_by_compression),
                        StrCat(c.compressed_tenants),
                        StrCat(Fixed(static_cast<double>(c.compressed_milli) / 1000, 2), " GPUs")});
      }
    }
    std::vector<size_t> w(prio[0].size(), 0);
    for (const auto& r : prio) {
      for (size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
    }
    for (const auto& r : prio) AppendRow(out, r, w);
  }
  out +=
      "\nUNALLOCATED@N%: GPU capacity left unallocated when the pods arrived so far ask for N% of it (mean "
      "of the "
      "seeds, ± their standard deviation). FRAG: the share of idle GPU that is fragmented (FGD's measure). "
      "FAILED BY CAUSE: gpu = no GPU with room on a model the pod may use; gpu-model = room only on other "
      "models; cpu-memory = room only on nodes without the CPU or memory. Failures are per run, all "
      "arrivals.\n";
  if (priorities) {
    out +=
        "BY COMPRESSION: high-priority pods that fit only by compressing low-priority tenants (SharedGPU). "
        "COMPRESSED TENANTS, SHARE GIVEN UP: at the end of the run, the low-priority tenants holding less "
        "than they asked, and the GPU they gave up in all.\n";
  }
  return out;
}

std::string FormatJson(const ReportInfo& info, const std::vector<PolicySummary>& summaries) {
  using nlohmann::json;
  auto curve = [](const std::vector<double>& v) {
    json a = json::array();
    for (double x : v) a.push_back(std::isnan(x) ? json(nullptr) : json(std::round(x * 1000) / 1000));
    return a;
  };
  json j;
  j["nodes"] = info.nodes;
  j["pods"] = info.pods;
  j["node_count"] = info.node_count;
  j["gpu_count"] = info.gpu_count;
  j["pod_count"] = info.pod_count;
  j["inflate"] = info.inflate;
  j["seeds"] = info.seeds;
  if (!info.bounds.empty()) {
    const BoundSummary b = SummarizeBounds(info.bounds);
    json bound;
    bound["offline_pct_at_100"] = b.offline_mean;
    bound["offline_pct_at_100_se"] = b.offline_se;
    bound["online_floor_pct_at_100"] = b.floor_mean;
    bound["online_floor_pct_at_100_se"] = b.floor_se;
    if (b.grouped) {
      bound["share_sizes_grouped"] = true;
      bound["grouping_slack_pct_max"] = std::isnan(b.slack_max) ? json(nullptr) : json(b.slack_max);
    }
    bound["per_seed"] = json::array();
    for (const SeedBound& s : info.bounds) {
      bound["per_seed"].push_back({{"seed", s.seed},
                                   {"offline_pct_at_100", s.offline.unallocated_pct},
                                   {"online_floor_pct_at_100", s.online_floor.unallocated_pct},
                                   {"online_floor_feasible", s.online_floor.feasible},
                                   {"patterns", s.offline.patterns + s.online_floor.patterns},
                                   {"lp_solves", s.offline.iterations + s.online_floor.iterations}});
      if (s.offline.share_sizes_grouped) {
        auto slack = [](double pct) { return std::isnan(pct) ? json(nullptr) : json(pct); };
        bound["per_seed"].back()["offline_grouping_slack_pct"] = slack(s.offline.grouping_slack_pct);
        bound["per_seed"].back()["online_floor_grouping_slack_pct"] =
            slack(s.online_floor.grouping_slack_pct);
      }
    }
    j["bound"] = bound;
  }
  const bool priorities = ShowPriorities(info, summaries);
  if (priorities) {
    j["priority"] = {{"high_priority_qos", info.high_priority_qos},
                     {"compression", info.compression},
                     {"share_memory", info.share_memory_none ? "none" : "proportional"}};
  }
  json policies = json::object();
  for (const PolicySummary& s : summaries) {
    json p;
    if (priorities) {
      p["priority_per_seed"] = json::array();
      for (size_t i = 0; i < s.priority.size(); ++i) {
        const PriorityCounts& c = s.priority[i];
        p["priority_per_seed"].push_back({{"seed", s.seeds[i]},
                                          {"high_pods", c.high_pods},
                                          {"high_placed", c.high_placed},
                                          {"high_unplaced", c.high_unplaced()},
                                          {"placed_by_compression", c.placed_by_compression},
                                          {"compressed_tenants", c.compressed_tenants},
                                          {"compressed_milli", c.compressed_milli}});
      }
    }
    p["unallocated_pct_at_100"] = s.Mean100();
    // At 130% arrived; the workload's last step when it is scaled to another share.
    p["unallocated_pct_at_130"] = s.Mean130();
    p["end_pct"] = static_cast<int>(std::ceil(info.inflate * 100 - 1e-9));
    p["unallocated_pct_at_100_std"] = s.Std100();
    p["per_seed"] = json::array();
    for (size_t i = 0; i < s.seeds.size(); ++i) {
      p["per_seed"].push_back({{"seed", s.seeds[i]},
                               {"unallocated_pct_at_100", s.unallocated_at_100[i]},
                               {"unallocated_pct_at_130", s.unallocated_at_130[i]}});
    }
    p["placed"] = s.placed;
    p["pods"] = s.pods;
    p["failed_pods_by_shape"] = s.failed_by_shape;
    p["failed_pods_by_cause"] = s.failed_by_cause;
    p["seconds_per_run"] = s.seconds;
    std::vector<double> unallocated = s.mean.allocated_pct;
    for (double& x : unallocated) x = 100.0 - x;  // NaN stays NaN
    p["curve"] = {{"arrived_pct_step", 1},
                  {"allocated_pct", curve(s.mean.allocated_pct)},
                  {"unallocated_pct", curve(unallocated)},
                  {"fragmentation_gpus", curve(s.mean.frag_gpus)},
                  {"fragmentation_ratio_pct", curve(s.mean.frag_ratio_pct)}};
    policies[s.policy] = p;
  }
  j["policies"] = policies;
  return j.dump(2) + "\n";
}

namespace {

// Colour-blind-safe palette (Okabe-Ito, then Tableau's), one colour per policy.
constexpr const char* kColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                                    "#000000", "#F0E442", "#8C564B", "#7F7F7F", "#BCBD22"};

struct Panel {
  double x0, y0, w, h;            // pixels
  double xmin, xmax, ymin, ymax;  // data
  double X(double x) const { return x0 + (x - xmin) / (xmax - xmin) * w; }
  double Y(double y) const { return y0 + h - (y - ymin) / (ymax - ymin) * h; }
};

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else {
      out += c;
    }
  }
  return out;
}

void Axes(std::string& svg, const Panel& p, double xstep, double ystep, const std::string& xlabel,
          const std::string& ylabel, const std::string& title) {
  StrAppend(&svg, "<rect x='", Fixed(p.x0, 1), "' y='", Fixed(p.y0, 1), "' width='", Fixed(p.w, 1),
            "' height='", Fixed(p.h, 1), "' fill='none' stroke='#444'/>\n");
  for (double x = std::ceil(p.xmin / xstep) * xstep; x <= p.xmax + 1e-9; x += xstep) {
    StrAppend(&svg, "<line x1='", Fixed(p.X(x), 1), "' y1='", Fixed(p.y0, 1), "' x2='", Fixed(p.X(x), 1),
              "' y2='", Fixed(p.y0 + p.h, 1), "' stroke='#e4e4e4'/>\n");
    StrAppend(&svg, "<text x='", Fixed(p.X(x), 1), "' y='", Fixed(p.y0 + p.h + 16, 1),
              "' text-anchor='middle' font-size='11'>", Fixed(x, 0), "</text>\n");
  }
  for (double y = std::ceil(p.ymin / ystep) * ystep; y <= p.ymax + 1e-9; y += ystep) {
    StrAppend(&svg, "<line x1='", Fixed(p.x0, 1), "' y1='", Fixed(p.Y(y), 1), "' x2='", Fixed(p.x0 + p.w, 1),
              "' y2='", Fixed(p.Y(y), 1), "' stroke='#e4e4e4'/>\n");
    StrAppend(&svg, "<text x='", Fixed(p.x0 - 6, 1), "' y='", Fixed(p.Y(y) + 4, 1),
              "' text-anchor='end' font-size='11'>", Fixed(y, ystep < 1 ? 1 : 0), "</text>\n");
  }
  StrAppend(&svg, "<text x='", Fixed(p.x0 + p.w / 2, 1), "' y='", Fixed(p.y0 + p.h + 36, 1),
            "' text-anchor='middle' font-size='12'>", Escape(xlabel), "</text>\n");
  StrAppend(&svg, "<text transform='translate(", Fixed(p.x0 - 40, 1), ",", Fixed(p.y0 + p.h / 2, 1),
            ") rotate(-90)' text-anchor='middle' font-size='12'>", Escape(ylabel), "</text>\n");
  StrAppend(&svg, "<text x='", Fixed(p.x0 + p.w / 2, 1), "' y='", Fixed(p.y0 - 10, 1),
            "' text-anchor='middle' font-size='13' font-weight='bold'>", Escape(title), "</text>\n");
}

void Line(std::string& svg, const Panel& p, const std::vector<double>& ys, int from, int to, bool invert,
          const char* colour) {
  std::string path;
  bool pen = false;
  for (int x = from; x <= to && x < static_cast<int>(ys.size()); ++x) {
    double y = ys[static_cast<size_t>(x)];
    if (std::isnan(y)) {
      pen = false;
      continue;
    }
    if (invert) y = 100.0 - y;
    y = std::clamp(y, p.ymin, p.ymax);
    StrAppend(&path, pen ? " L" : " M", Fixed(p.X(x), 1), " ", Fixed(p.Y(y), 1));
    pen = true;
  }
  StrAppend(&svg, "<path d='", path, "' fill='none' stroke='", colour, "' stroke-width='1.8'/>\n");
}

}  // namespace

std::string PlotSvg(const ReportInfo& info, const std::vector<PolicySummary>& summaries) {
  const int max_pct = static_cast<int>(std::ceil(info.inflate * 100 - 1e-9));
  // A file's base name; a described source such as "bundled example (examples/sim/pods.csv)" keeps its
  // description.
  auto base = [](const std::string& path) {
    if (!path.empty() && path.back() == ')') return path.substr(0, path.find(" ("));
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
  };
  const double width = 1120, height = 470;
  std::string svg = StrCat("<svg xmlns='http://www.w3.org/2000/svg' width='", Fixed(width, 0), "' height='",
                           Fixed(height, 0), "' viewBox='0 0 ", Fixed(width, 0), " ", Fixed(height, 0),
                           "' font-family='Helvetica, Arial, sans-serif'>\n<rect width='100%' height='100%' "
                           "fill='white'/>\n");
  StrAppend(
      &svg, "<text x='", Fixed(width / 2, 0), "' y='24' text-anchor='middle' font-size='15'>",
      Escape(StrCat("GPU allocation by policy: ",
                    base(info.pods) == base(info.nodes) ? base(info.pods)
                                                        : StrCat(base(info.pods), " on ", base(info.nodes)),
                    " (", info.gpu_count, " GPUs), mean of ", info.seeds.size(),
                    info.seeds.size() == 1 ? " seed" : " seeds")),
      "</text>\n");
  // Left: allocation over the whole run.
  Panel left{70, 60, 360, 330, 0, static_cast<double>(max_pct), 0, 100};
  Axes(svg, left, 10, 10, "arrived workload (% of GPU capacity)", "GPU allocated (% of capacity)",
       "GPU allocation ratio");
  StrAppend(&svg, "<line x1='", Fixed(left.X(0), 1), "' y1='", Fixed(left.Y(0), 1), "' x2='",
            Fixed(left.X(100), 1), "' y2='", Fixed(left.Y(100), 1),
            "' stroke='#999' stroke-dasharray='4 3'/>\n");
  // Right: the same near saturation, zoomed to where the policies part.
  const int from = std::max(0, std::min(80, max_pct - 10));
  double ymin = 100;
  for (const PolicySummary& s : summaries) {
    for (int x = from; x <= max_pct && x < static_cast<int>(s.mean.allocated_pct.size()); ++x) {
      const double y = s.mean.allocated_pct[static_cast<size_t>(x)];
      if (!std::isnan(y)) ymin = std::min(ymin, y);
    }
  }
  ymin = std::max(0.0, std::floor((ymin - 1) / 5.0) * 5.0);
  Panel right{520, 60, 360, 330, static_cast<double>(from), static_cast<double>(max_pct), ymin, 100};
  Axes(svg, right, 10,
       (100 - ymin) > 20  ? 5
       : (100 - ymin) > 8 ? 2
                          : 1,
       "arrived workload (% of GPU capacity)", "GPU allocated (% of capacity)",
       "Near saturation (higher is better)");
  StrAppend(&svg, "<text x='", Fixed(910, 0), "' y='", Fixed(70, 0), "' font-size='12' font-weight='bold'>",
            "unallocated at 100%</text>\n");
  for (size_t i = 0; i < summaries.size(); ++i) {
    const char* colour = kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
    Line(svg, left, summaries[i].mean.allocated_pct, 0, max_pct, false, colour);
    Line(svg, right, summaries[i].mean.allocated_pct, from, max_pct, false, colour);
    // Legend, right of the panels.
    const double lx = 910, ly = 92 + 18.0 * static_cast<double>(i);
    StrAppend(&svg, "<line x1='", Fixed(lx, 1), "' y1='", Fixed(ly - 4, 1), "' x2='", Fixed(lx + 22, 1),
              "' y2='", Fixed(ly - 4, 1), "' stroke='", colour, "' stroke-width='2.5'/>\n");
    StrAppend(&svg, "<text x='", Fixed(lx + 28, 1), "' y='", Fixed(ly, 1), "' font-size='12'>",
              Escape(StrCat(summaries[i].policy, "  ", Fixed(summaries[i].Mean100(), 2), "%")), "</text>\n");
  }
  if (!info.bounds.empty() && max_pct >= 100) {
    // The LP bound and the online floor at 100% arrived: the most any placement (any online one) allocates.
    const BoundSummary b = SummarizeBounds(info.bounds);
    const std::pair<double, const char*> marks[] = {{b.offline_mean, "LP bound"},
                                                    {b.floor_mean, "online floor"}};
    for (size_t i = 0; i < 2; ++i) {
      const double y = std::clamp(100.0 - marks[i].first, right.ymin, right.ymax);
      const char* dash = i == 0 ? "2 2" : "6 3";
      StrAppend(&svg, "<line x1='", Fixed(right.X(std::max(from, 96)), 1), "' y1='", Fixed(right.Y(y), 1),
                "' x2='", Fixed(right.X(std::min(max_pct, 104)), 1), "' y2='", Fixed(right.Y(y), 1),
                "' stroke='black' stroke-width='1.5' stroke-dasharray='", dash, "'/>\n");
      const double lx = 910, ly = 92 + 18.0 * static_cast<double>(summaries.size() + i);
      StrAppend(&svg, "<line x1='", Fixed(lx, 1), "' y1='", Fixed(ly - 4, 1), "' x2='", Fixed(lx + 22, 1),
                "' y2='", Fixed(ly - 4, 1), "' stroke='black' stroke-width='1.5' stroke-dasharray='", dash,
                "'/>\n");
      StrAppend(&svg, "<text x='", Fixed(lx + 28, 1), "' y='", Fixed(ly, 1), "' font-size='12'>",
                Escape(StrCat(marks[i].second, "  ", Fixed(marks[i].first, 2), "%")), "</text>\n");
    }
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace tessera::sim
