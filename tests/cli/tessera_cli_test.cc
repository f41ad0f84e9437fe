// The `tessera` binary as users run it, in a subprocess: exit codes, output, and errors on bad input.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include "run_binary.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using Result = tessera::testing::BinaryResult;

Result Tessera(const std::string& args) {
  return tessera::testing::RunBinary("tessera", args);
}

std::string Data(const std::string& relative) {
  return std::string(TESSERA_SOURCE_DIR) + "/" + relative;
}

std::string TempFile(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << content;
  return path;
}

// A zero memory limit used to mean "no limit", silently.
TEST(TesseraCliTest, RunRefusesAZeroMemoryLimit) {
  for (const char* zero : {"0", "0GiB", "0MiB"}) {
    Result r = Tessera(std::string("run --gpu-memory ") + zero + " -- true");
    EXPECT_EQ(r.status, 2) << zero;
    EXPECT_THAT(r.output, HasSubstr("is zero")) << zero;
  }
}

TEST(TesseraCliTest, HelpForEveryCommand) {
  for (const char* cmd : {"--help", "place --help", "simulate --help", "topo --help", "version --help"}) {
    Result r = Tessera(cmd);
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_THAT(r.output, HasSubstr("Usage")) << cmd;
  }
  EXPECT_NE(Tessera("").status, 0);  // a command is required
  EXPECT_THAT(Tessera("version").output, HasSubstr("tessera 0."));
}

TEST(TesseraCliTest, PlaceRunsTheBundledExample) {
  Result r = Tessera("place");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Cluster: bundled example"));
  EXPECT_THAT(r.output, HasSubstr("research/train-4gpu"));
  // The scheduler's policy (tessera) is the default: the 90% high-priority pod takes the T4 with the most free
  // share, and its one low-priority tenant gives D = 90 - 60 = 30 (SharedGPU's equations, Q = 0, R = 30).
  EXPECT_THAT(r.output, HasSubstr("Policy:  tessera"));
  EXPECT_THAT(r.output, HasSubstr("compressed default/chat-infer-3/server on t4-box GPU3 from 40% to 10%"));
  EXPECT_THAT(r.output, HasSubstr("namespace research holds 6.5 of its 6.5 A100-SXM4-80GB GPUs (quota)"));
  EXPECT_THAT(r.output, HasSubstr("the pod allows only H100-SXM5-80GB"));
  EXPECT_THAT(r.output, HasSubstr("GPU use:"));
  // Same seed, same decisions.
  EXPECT_EQ(Tessera("place --seed 7").output, Tessera("place --seed 7").output);
}

TEST(TesseraCliTest, PlaceWithEveryPolicy) {
  for (const char* policy : {"gaia", "binpack", "spread", "gpushare", "tessera", "fgd", "bestfit"}) {
    Result r = Tessera(std::string("place --policy ") + policy);
    EXPECT_EQ(r.status, 0) << policy << r.output;
    EXPECT_THAT(r.output, HasSubstr("Placed ")) << policy;
  }
  Result bad = Tessera("place --policy fastest");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("unknown placement policy \"fastest\"; choose one of: tessera, gaia"));
}

TEST(TesseraCliTest, PlaceReportsBadFiles) {
  Result missing = Tessera("place --cluster /nonexistent.yaml");
  EXPECT_NE(missing.status, 0);
  EXPECT_THAT(missing.output, HasSubstr("/nonexistent.yaml"));
  std::string broken = TempFile("broken.yaml", "nodes:\n  - name: a\n    gpus: {model: T4}\n");
  Result r = Tessera("place --cluster " + broken);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("broken.yaml line 3: the gpus shorthand needs model, count and memoryMiB"));
  std::string bad_pod =
      TempFile("badpod.yaml",
               "pods:\n  - name: p\n    containers:\n      - resources: {tessera.dev/gpu-cores: 150, "
               "tessera.dev/gpu: 2}\n");
  Result p = Tessera("place --pods " + bad_pod);
  EXPECT_EQ(p.status, 0);  // a refused pod is a decision, not a failure
  EXPECT_THAT(p.output, HasSubstr("default/p: container \"main\": tessera.dev/gpu-cores is 150"));
}

// 16 containers at the per-container cap (2^50 cores) and one more used to sum past 2^64 to one core, and the
// pod was placed on a 48-core node.
TEST(TesseraCliTest, PlaceRefusesHostSumsThatWouldWrap) {
  std::string cluster =
      TempFile("cpu48.yaml",
               "nodes:\n  - {name: big, cpuMilli: 48000, gpus: {model: T4, count: 1, memoryMiB: "
               "15360}}\n");
  std::string pods =
      "pods:\n  - name: wrap\n    containers:\n      - {name: c0, resources: {tessera.dev/gpu: 1, "
      "cpu: \"1125899906842624\"}}\n";
  for (int i = 1; i < 16; ++i) {
    pods += "      - {name: c" + std::to_string(i) + ", resources: {cpu: \"1125899906842624\"}}\n";
  }
  pods += "      - {name: last, resources: {cpu: \"432345564227568616m\"}}\n";
  Result r = Tessera("place --cluster " + cluster + " --pods " + TempFile("wrap.yaml", pods));
  EXPECT_EQ(r.status, 0) << r.output;  // a refused pod is a decision
  EXPECT_THAT(r.output,
              HasSubstr("default/wrap: the pod's containers ask for more cpu in all than any node has"));
  EXPECT_THAT(r.output, HasSubstr("Placed 0 of 1 pods."));
}

TEST(TesseraCliTest, SimulateRunsTheBundledExample) {
  Result r = Tessera("simulate");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Cluster:  bundled example"));
  for (const char* policy : {"tessera", "fgd", "bestfit", "packing", "random"})
    EXPECT_THAT(r.output, HasSubstr(policy));
  EXPECT_THAT(r.output, HasSubstr("UNALLOCATED@100%"));
}

TEST(TesseraCliTest, SimulateJsonAndPlot) {
  const std::string plot = ::testing::TempDir() + "curves.svg";
  Result r = Tessera("simulate --nodes " + Data("examples/sim/nodes.csv") + " --pods " +
                     Data("examples/sim/pods.csv") +
                     " --policies tessera,fgd --seeds 1-2 --inflate 1.2 --json --plot " + plot);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("\"unallocated_pct_at_100\""));
  EXPECT_THAT(r.output, HasSubstr("\"unallocated_pct_at_130\""));
  EXPECT_THAT(r.output, HasSubstr("\"inflate\": 1.2"));
  std::ifstream svg(plot);
  std::string head;
  std::getline(svg, head);
  EXPECT_THAT(head, HasSubstr("<svg"));
}

TEST(TesseraCliTest, SimulateRefusesBadInput) {
  const std::string nodes = Data("examples/sim/nodes.csv");
  const std::string pods = Data("examples/sim/pods.csv");
  struct Case {
    std::string args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"simulate --nodes " + nodes, "give both --nodes and --pods"},
           {"simulate --policies fastest", "unknown policy \"fastest\""},
           {"simulate --seeds 9-3", "write a seed (42), a range (42-51)"},
           {"simulate --inflate 0", "--inflate 0 is outside"},
           {"simulate --threads -3", "--threads -3 is outside [0, 1024]"},
           {"simulate --plot out.png", "give a file name ending in .svg"},
           {"simulate --high-priority-qos XX",
            "--high-priority-qos \"XX\": qos class \"XX\" is not one of the trace's; name among: LS, BE, "
            "Burstable, Guaranteed"},
           {"simulate --high-priority-qos LS", "(examples/sim/pods.csv): the header has no qos column"},
           {"simulate --share-memory half", "--share-memory \"half\": write proportional"},
           {"simulate --nodes " +
                TempFile("bad-nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,two,T4\n") + " --pods " +
                pods,
            "bad-nodes.csv line 2: gpu is \"two\""},
           {"simulate --nodes " +
                TempFile("cpu-nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,64000,1024,0,\n") +
                " --pods " + pods,
            "has no GPU"},
       }) {
    Result r = Tessera(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.says)) << c.args;
  }
}

TEST(TesseraCliTest, SimulateReportsPriorities) {
  const std::string nodes =
      TempFile("prio-nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,2,T4\n");
  const std::string pods = TempFile("prio-pods.csv",
                                    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n"
                                    "a,1000,1024,1,600,,BE\nb,1000,1024,1,700,,LS\nc,1000,1024,1,600,,BE\n");
  const std::string base = "simulate --nodes " + nodes + " --pods " + pods + " --seeds 42-43 --inflate 0.95";
  Result on = Tessera(base + " --high-priority-qos LS --share-memory none");
  ASSERT_EQ(on.status, 0) << on.output;
  EXPECT_THAT(on.output, HasSubstr("Priority: qos LS high, the rest low; compression on; shares' GPU memory "
                                   "none (compute only)"));
  EXPECT_THAT(on.output, HasSubstr("HIGH PLACED"));
  Result off = Tessera(base + " --high-priority-qos LS --no-compression --json");
  ASSERT_EQ(off.status, 0) << off.output;
  EXPECT_THAT(off.output, HasSubstr("\"compression\": false"));
  EXPECT_THAT(off.output, HasSubstr("\"priority_per_seed\""));
  Result plain = Tessera(base);
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_THAT(plain.output, Not(HasSubstr("HIGH PLACED")));
}

// --inflate on a large cluster with tiny pods used to clone until bad_alloc: 10 x 8,000 GPUs of
// one-thousandth pods is 80 million arrivals.
TEST(TesseraCliTest, SimulateRefusesAnInflatePastThePodCap) {
  std::string nodes = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 1000; ++i) nodes += "n" + std::to_string(i) + ",96000,393216,8,A100\n";
  const std::string pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\ntiny,100,100,1,1,\n";
  Result r = Tessera("simulate --nodes " + TempFile("inflate-nodes.csv", nodes) + " --pods " +
                     TempFile("inflate-pods.csv", pods) + " --inflate 10");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("a replay takes at most 5000000: lower --inflate"));
}

TEST(TesseraCliTest, TopoDrawsTheTree) {
  Result r = Tessera("topo " + Data("tests/testdata/topo/two-socket-8gpu.txt"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SYS (60)\n  PHB (40)\n    PIX (20)\n      GPU0 (20)"));
  EXPECT_THAT(r.output, HasSubstr("GPU7: NUMA ?, CPUs 10-19,30-39"));
  Result bad = Tessera("topo " + TempFile("bad.txt", "hello\n"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("no topology matrix found"));
  // A garbled GPU column used to be dropped: 3 GPUs in, "2 GPUs" out, exit 0.
  Result garbled = Tessera("topo " + TempFile("garbled.txt",
                                              "\tGPU0\tGPU1\tGPU#2\nGPU0\t X \tPIX\tPIX\n"
                                              "GPU1\tPIX\t X \tPIX\nGPU#2\tPIX\tPIX\t X \n"));
  EXPECT_EQ(garbled.status, 2);
  EXPECT_THAT(garbled.output, HasSubstr("GPU#2"));
  // /dev/zero used to end in bad_alloc.
  Result zero = Tessera("topo /dev/zero");
  EXPECT_EQ(zero.status, 2);
  EXPECT_THAT(zero.output, HasSubstr("is larger than"));
}

}  // namespace

// tessera inspect on a saved /inspect answer of tessera-scheduler (tests/testdata/inspect/t4-box.json: three
// tenants on a 4 x T4 node, GPU 3 marked unhealthy).
TEST(TesseraCliTest, InspectShowsTenantsPerGpuAndASummary) {
  Result r = Tessera("inspect --file " + Data("tests/testdata/inspect/t4-box.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("team-a/web-1"));
  EXPECT_THAT(r.output, HasSubstr("UNHEALTHY"));
  // 30% + 50% + 100% of 4 GPUs; 4 + 6 + 15 GiB of 60.
  EXPECT_THAT(r.output, HasSubstr("1 node, 4 GPUs (1 unhealthy): 1 whole GPU free, 0 shared by several tenants, "
                                   "3 tenants"));
  EXPECT_THAT(r.output, HasSubstr("compute committed 1.8 GPUs (45%), memory 25.0 of 60.0 GiB"));
  // Column headers over the GPU and tenant rows; UUIDs cut to 18 characters unless --wide.
  EXPECT_THAT(r.output, HasSubstr("POD"));
  EXPECT_THAT(r.output, HasSubstr("PRIORITY"));
  Result json = Tessera("inspect --json --file " + Data("tests/testdata/inspect/t4-box.json"));
  EXPECT_THAT(json.output, HasSubstr("\"podUID\""));
  // A node the inspection does not hold is an error that names the ones it does.
  Result other = Tessera("inspect --node nowhere --file " + Data("tests/testdata/inspect/t4-box.json"));
  EXPECT_EQ(other.status, 2) << other.output;
  EXPECT_THAT(other.output, HasSubstr("no node nowhere in the inspection; it has 1 node: t4-box"));
}

TEST(TesseraCliTest, InspectCutsUuidsUnlessWide) {
  const std::string file = TempFile("long-uuid.json", R"({"nodes": [{"name": "n1", "gpus": [{"index": 0,
      "model": "H100", "uuid": "GPU-5d3c9a47-1b2e-4c1f-9a3e-2b7f3f8c9d10", "coresUsed": 0, "memoryMiB": 81920,
      "memoryUsedMiB": 0, "tenants": []}]}]})");
  Result cut = Tessera("inspect --file " + file);
  ASSERT_EQ(cut.status, 0) << cut.output;
  EXPECT_THAT(cut.output, HasSubstr("GPU-5d3c9a47-1b2e-"));
  EXPECT_THAT(cut.output, Not(HasSubstr("GPU-5d3c9a47-1b2e-4c1f-9a3e-2b7f3f8c9d10")));
  Result wide = Tessera("inspect --wide --file " + file);
  EXPECT_THAT(wide.output, HasSubstr("GPU-5d3c9a47-1b2e-4c1f-9a3e-2b7f3f8c9d10"));
  EXPECT_THAT(wide.output, HasSubstr("1 node, 1 GPU (0 unhealthy): 1 whole GPU free"));
}

TEST(TesseraCliTest, InspectExplainsWhatItCannotRead) {
  Result bad = Tessera("inspect --file " + TempFile("not-inspect.json", R"({"items": []})"));
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("not tessera-scheduler's /inspect JSON"));
  Result down = Tessera("inspect --scheduler http://127.0.0.1:1");
  EXPECT_EQ(down.status, 2);
  EXPECT_THAT(down.output, HasSubstr("cannot reach tessera-scheduler"));
  Result no_config = Tessera("inspect --kubeconfig /nonexistent/kubeconfig");
  EXPECT_EQ(no_config.status, 2);
  EXPECT_THAT(no_config.output, HasSubstr("--scheduler"));
}

// tessera-node's DRA flags (docs/dra.md): a clear error before anything is served.
TEST(TesseraNodeCliTest, DraGpusRefusedWithAClearError) {
  const std::string kubeconfig = TempFile("dra-kubeconfig.yaml", R"(apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
)");
  const std::string gpus = Data("examples/fake-gpus/two-socket-8gpu.yaml");
  const std::string state = ::testing::TempDir() + "dra-state";
  const std::string base = "--node-name n --fake-gpus " + gpus + " --state-dir " + state +
                           " --pod-resources-socket " + state + "/none.sock --metrics-listen ''";
  Result r = tessera::testing::RunBinary("tessera-node", base + " --fake-api " + TempFile("dra-api.json", "{\"pods\": []}") +
                                                 " --dra-gpus all");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--dra-gpus needs the API server"));
  r = tessera::testing::RunBinary("tessera-node", base + " --kubeconfig " + kubeconfig + " --dra-gpus 6,9");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--dra-gpus names GPU 9; this node has GPUs 0-7"));
  r = tessera::testing::RunBinary("tessera-node", base + " --kubeconfig " + kubeconfig + " --dra-gpus six");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("give \"all\" or GPU indices such as 6,7 or 4-7"));
}

// --fake-gpus /dev/zero used to read until bad_alloc.
TEST(TesseraNodeCliTest, EndlessFakeGpuFileIsRefused) {
  const std::string state = ::testing::TempDir() + "zero-state";
  Result r = tessera::testing::RunBinary("tessera-node", "--node-name n --fake-gpus /dev/zero --state-dir " +
                                                             state + " --pod-resources-socket " + state +
                                                             "/none.sock --metrics-listen '' --fake-api " +
                                                             TempFile("zero-api.json", "{\"pods\": []}"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("/dev/zero is larger than 1048576 bytes"));
  EXPECT_THAT(r.output, HasSubstr("--fake-gpus"));
}
