// tessera: the command-line tool. `tessera --help` lists the subcommands.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "common/log.h"
#include "core/placement/policy.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tessera: GPU sharing for Kubernetes. Places pods on shared GPUs by topology, and shows who holds "
      "what.\nRun `tessera <command> --help` for a command's options."};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log what happens (to stderr); TESSERA_LOG=debug for more");

  tessera::cli::PlaceOptions place;
  CLI::App* place_cmd = app.add_subcommand(
      "place",
      "Place a list of pods on a cluster, one after the other, and show each decision and who holds "
      "which GPU. With no files, runs on the bundled example cluster and pods.");
  place_cmd->add_option("--cluster", place.cluster_file, "Cluster file (YAML or JSON; docs/file-formats.md)")
      ->check(CLI::ExistingFile);
  place_cmd->add_option("--pods", place.pods_file, "Workload file with the pods, in arrival order")
      ->check(CLI::ExistingFile);
  std::string policies;
  for (const std::string& p : tessera::core::PolicyNames()) policies += (policies.empty() ? "" : ", ") + p;
  place_cmd->add_option("--policy", place.policy, "Placement policy: " + policies)->capture_default_str();
  place_cmd->add_option("--seed", place.seed, "Seed for random tie-breaking")->capture_default_str();

  tessera::cli::SimulateOptions sim;
  CLI::App* sim_cmd = app.add_subcommand(
      "simulate",
      "Replay a workload on a modelled cluster, as the FGD study does: scale it to --inflate x the GPU "
      "capacity, "
      "shuffle it with each seed, place pods one at a time, and report how much GPU each policy leaves "
      "unallocated. With no files, runs a few policies on the bundled example.");
  sim_cmd
      ->add_option("--nodes", sim.nodes_file,
                   "Cluster: the trace's node CSV (sn,cpu_milli,memory_mib,gpu,model) or a cluster file")
      ->check(CLI::ExistingFile);
  sim_cmd
      ->add_option(
          "--pods", sim.pods_file,
          "Workload: the trace's pod CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...) or "
          "a workload file")
      ->check(CLI::ExistingFile);
  sim_cmd->add_option("--policies", sim.policies,
                      "Comma-separated policies: " + policies + " (default: tessera)");
  sim_cmd->add_option("--seeds", sim.seeds, "Seeds: 42, 42-51 or 42,43,50 (default: 42)");
  sim_cmd->add_option("--inflate", sim.inflate, "Scale the workload to this multiple of GPU capacity")
      ->capture_default_str();
  sim_cmd->add_flag("--json", sim.json, "Print JSON instead of the table");
  sim_cmd->add_option("--plot", sim.plot_file,
                      "Write the allocation curves of all policies to this SVG file");
  sim_cmd->add_option("--threads", sim.threads,
                      "Runs (and seeds' bounds) in parallel; 0: one per core (default)");
  sim_cmd->add_flag(
      "--bound", sim.bound,
      "Also compute, per seed, the LP lower bound on unallocated GPU at 100% arrived and the "
      "online floor (every pod arriving before 95% placed); --policies none computes only these");
  sim_cmd->add_option(
      "--high-priority-qos", sim.high_priority_qos,
      "Place the trace's pods of these QoS classes (its qos column: LS, BE, Burstable, Guaranteed; "
      "comma-separated) as high priority, the rest low, and report what priorities did (default: none)");
  sim_cmd->add_flag("--no-compression", sim.no_compression,
                    "Never compress low-priority tenants for a high-priority pod that fits nowhere "
                    "(SharedGPU's compression, on by default), to measure what it buys");
  sim_cmd
      ->add_option("--share-memory", sim.share_memory,
                   "GPU memory of a share whose memory is left out (all the trace's): proportional to "
                   "the share, or none (compute only, the trace's one dimension)")
      ->capture_default_str();

  tessera::cli::TopoOptions topo;
  CLI::App* topo_cmd = app.add_subcommand(
      "topo", "Read the matrix `nvidia-smi topo -m` prints and show Gaia's access-cost tree of those GPUs.");
  topo_cmd
      ->add_option("file", topo.file, "File with the output of `nvidia-smi topo -m`; - for standard input")
      ->capture_default_str();

  tessera::cli::InspectOptions inspect;
  CLI::App* inspect_cmd = app.add_subcommand(
      "inspect",
      "Who holds what: per node and GPU the model, compute and memory committed and the tenants, and a "
      "cluster summary. Reads the cluster's API server (as the scheduler would rebuild it), a running "
      "tessera-scheduler (--scheduler), or a saved /inspect JSON (--file). As a kubectl plugin: kubectl "
      "tessera inspect.");
  inspect_cmd->add_option(
      "--kubeconfig", inspect.kubeconfig,
      "Kubeconfig (default: in a pod its service account, else $KUBECONFIG or ~/.kube/config)");
  inspect_cmd->add_option("--context", inspect.context, "Kubeconfig context");
  inspect_cmd->add_option("-n,--namespace", inspect.ns, "Only pods of this namespace");
  inspect_cmd->add_option("--scheduler", inspect.scheduler,
                          "Ask a running tessera-scheduler instead, e.g. http://localhost:8888");
  inspect_cmd->add_option("--file", inspect.file, "Read a saved /inspect JSON instead")
      ->check(CLI::ExistingFile);
  inspect_cmd->add_option("--node", inspect.node, "Only this node");
  inspect_cmd->add_flag("--json", inspect.json, "Print the JSON");
  inspect_cmd->add_flag("--summary", inspect.summary_only, "Print only the cluster summary");
  inspect_cmd->add_flag("--wide", inspect.wide, "Print full GPU UUIDs");

  tessera::cli::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand(
      "run",
      "Run a command under Tessera's isolation (CUDA or OpenCL) on this machine, no Kubernetes needed: "
      "tessera run --gpu-memory 4GiB --gpu-cores 30 [--policy elastic] -- COMMAND...");
  run_cmd->add_option("--gpu-memory", run.gpu_memory, "Device memory limit per GPU: 512MiB, 4GiB or bytes");
  run_cmd->add_option("--gpu-cores", run.gpu_cores, "Compute share per GPU, percent (1-100)")
      ->capture_default_str();
  run_cmd->add_option("--policy", run.policy, "hard (stay at the share) or elastic (use idle compute)")
      ->capture_default_str();
  run_cmd->add_option("--ceiling", run.ceiling,
                      "Elastic: the most it may use when the GPU is idle (default 90)");
  run_cmd
      ->add_option("--priority", run.priority, "low or high (elastic: high keeps what it grew into longer)")
      ->capture_default_str();
  run_cmd->add_option("--region", run.region,
                      "Shared region file: give several commands the same one to share one quota");
  run_cmd
      ->add_option(
          "--api", run.api,
          "Which isolation library: auto (CUDA and OpenCL, whichever the program uses), cuda or opencl")
      ->capture_default_str();
  run_cmd->add_option(
      "--hook-library", run.hook_library,
      "A hook library to preload instead (default: from ../lib next to this binary, by --api)");
  run_cmd->add_option("command", run.command, "The command and its arguments, after --")->required();

  CLI::App* version_cmd = app.add_subcommand("version", "Print the version");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tessera::log::Init("tessera", verbose ? tessera::log::Level::kInfo : tessera::log::Level::kWarn);

  if (*place_cmd) return tessera::cli::RunPlace(place);
  if (*sim_cmd) return tessera::cli::RunSimulate(sim);
  if (*topo_cmd) return tessera::cli::RunTopo(topo);
  if (*inspect_cmd) return tessera::cli::RunInspect(inspect);
  if (*run_cmd) return tessera::cli::RunRun(run);
  if (*version_cmd) {
    std::cout << "tessera " << TESSERA_VERSION << "\n";
    return 0;
  }
  return 0;
}
