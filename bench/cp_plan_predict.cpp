// The planner's modelled times for bench/fit_cost_model.py: plan_cp / split_plan / no_cp_plan and
// predict_time_us (src/plan/cp_plan.h) with cost-model coefficients given on the command line, so
// the fit searches the coefficients through the planner's own code.
//
//   cp_plan_predict [fwd|bwd] [name=value ...]
//     the coefficients start from CostModel's forward defaults (fwd) or CostModel::backward() (bwd);
//     each name=value overrides one (fused_chunk_us, fused_item_us, state_chunk_us,
//     state_m_chunk_us, state_item_us, correction_step_us, correction_m_step_us,
//     correction_item_us, gate_scan_chunk_us, launch_us, and the integer min_segment_chunks)
//   stdin:  one line per plan: sequences v_heads tokens_per_sequence segment_chunks
//           (segment_chunks 0: no CP; -1: the planner's choice; L > 0: split_plan(L));
//           tokens_per_sequence may list every sequence's length, '+'-separated (28672+4096)
//   stdout: one line per plan: modelled_us target_segment_chunks (0: no CP)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "plan/cp_plan.h"

namespace {

using flashgdn::plan::CostModel;

double* coefficient(CostModel& model, const std::string& name) {
  struct Entry {
    const char* name;
    double CostModel::*member;
  };
  static constexpr Entry kEntries[] = {
      {"fused_chunk_us", &CostModel::fused_chunk_us},
      {"fused_item_us", &CostModel::fused_item_us},
      {"state_chunk_us", &CostModel::state_chunk_us},
      {"state_m_chunk_us", &CostModel::state_m_chunk_us},
      {"state_item_us", &CostModel::state_item_us},
      {"correction_step_us", &CostModel::correction_step_us},
      {"correction_m_step_us", &CostModel::correction_m_step_us},
      {"correction_item_us", &CostModel::correction_item_us},
      {"gate_scan_chunk_us", &CostModel::gate_scan_chunk_us},
      {"launch_us", &CostModel::launch_us},
  };
  for (const Entry& entry : kEntries)
    if (name == entry.name) return &(model.*entry.member);
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  namespace plan = flashgdn::plan;
  int first = 1;
  CostModel model;
  if (argc > 1 && (std::strcmp(argv[1], "fwd") == 0 || std::strcmp(argv[1], "bwd") == 0)) {
    if (std::strcmp(argv[1], "bwd") == 0) model = CostModel::backward();
    first = 2;
  }
  for (int i = first; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    const std::string name = eq ? std::string(argv[i], static_cast<size_t>(eq - argv[i])) : "";
    if (name == "min_segment_chunks") {
      model.min_segment_chunks = std::strtoll(eq + 1, nullptr, 10);
      continue;
    }
    double* value = eq ? coefficient(model, name) : nullptr;
    if (value == nullptr) {
      std::fprintf(stderr, "cp_plan_predict: expected name=value with a cost-model coefficient, got '%s'\n",
                   argv[i]);
      return 2;
    }
    *value = std::strtod(eq + 1, nullptr);
  }
  long long sequences, segment_chunks;
  int heads;
  char tokens[4096];
  while (std::scanf("%lld %d %4095s %lld", &sequences, &heads, tokens, &segment_chunks) == 4) {
    std::vector<int64_t> lengths;
    char* end = tokens;
    do lengths.push_back(std::strtoll(end + (end == tokens ? 0 : 1), &end, 10));
    while (*end == '+');
    if (lengths.size() == 1) lengths.assign(static_cast<size_t>(sequences), lengths.front());
    if (*end != '\0' || static_cast<long long>(lengths.size()) != sequences) {
      std::fprintf(stderr, "cp_plan_predict: %lld sequences but the lengths '%s'\n", sequences, tokens);
      return 2;
    }
    const plan::CpProblem problem{lengths, heads};
    try {
      const plan::CpPlan chosen = segment_chunks == 0  ? plan::no_cp_plan(problem)
                                  : segment_chunks < 0 ? plan::plan_cp(problem, model)
                                                       : plan::split_plan(problem, segment_chunks);
      std::printf("%.3f %lld\n", plan::predict_time_us(chosen, model),
                  static_cast<long long>(chosen.target_segment_chunks));
    } catch (const std::exception& error) {
      std::fprintf(stderr, "cp_plan_predict: %s\n", error.what());
      return 1;
    }
  }
  return 0;
}
