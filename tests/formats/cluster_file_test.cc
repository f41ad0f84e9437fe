#include "formats/cluster_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/files.h"

namespace tessera::formats {
namespace {

using ::testing::HasSubstr;

std::string Example(const std::string& name) {
  return *ReadTextFile(std::string(TESSERA_SOURCE_DIR) + "/examples/" + name);
}

std::string ClusterError(const std::string& yaml) {
  absl::StatusOr<ClusterFile> f = ParseClusterFile(yaml, "c.yaml");
  EXPECT_FALSE(f.ok());
  return f.ok() ? "" : std::string(f.status().message());
}

TEST(ClusterFileTest, BundledExample) {
  absl::StatusOr<ClusterFile> f = ParseClusterFile(Example("cluster-small.yaml"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->nodes.size(), 3u);
  const core::NodeInfo& dgx = f->nodes[0];
  EXPECT_EQ(dgx.name.value(), "dgx-a100");
  ASSERT_EQ(dgx.gpus.size(), 8u);
  EXPECT_EQ(dgx.gpus[3].uuid.value(), "GPU-dgx-a100-3");
  EXPECT_EQ(dgx.links.at(0, 7), core::Link::NvLink(12));
  EXPECT_EQ(dgx.gpus[4].numa_node, 7);              // from the topology's NUMA column
  EXPECT_EQ(dgx.numa_cpus.at(3), "48-63,176-191");  // and its CPU affinity
  EXPECT_EQ(f->nodes[2].numa_cpus.at(1), "10-19,30-39");
  ASSERT_EQ(f->quotas.size(), 1u);
  EXPECT_EQ(f->quotas[0].limit.value(), 6500);
  absl::StatusOr<core::Cluster> c = BuildCluster(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_count(), 3);
}

TEST(ClusterFileTest, JsonWorksToo) {
  absl::StatusOr<ClusterFile> f = ParseClusterFile(
      R"({"nodes": [{"name": "a", "gpus": [{"model": "T4", "memoryMiB": 15360, "uuid": "GPU-x"}],
                     "links": [["X"]]}]})");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->nodes[0].gpus[0].uuid.value(), "GPU-x");
}

TEST(ClusterFileTest, ReplicasMakeDistinctNodes) {
  absl::StatusOr<ClusterFile> f = ParseClusterFile(R"(
nodes:
  - name: t4
    replicas: 3
    gpus: {model: T4, count: 2, memoryMiB: 15360}
)");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->nodes.size(), 3u);
  EXPECT_EQ(f->nodes[2].name.value(), "t4-2");
  EXPECT_EQ(f->nodes[2].gpus[1].uuid.value(), "GPU-t4-2-1");
  EXPECT_TRUE(BuildCluster(*f).ok());
}

TEST(ClusterFileTest, ErrorsNameFileLineAndWhatToWrite) {
  EXPECT_THAT(ClusterError(""), HasSubstr("the file is empty"));
  EXPECT_THAT(ClusterError("nodes: [\n"), HasSubstr("c.yaml line"));
  EXPECT_THAT(ClusterError("nodes:\n  - name: a\n    gpu: {model: T4}\n"),
              HasSubstr("c.yaml line 3: unknown field \"gpu\" in a node; expected one of: name, replicas"));
  EXPECT_THAT(ClusterError("nodes:\n  - name: a\n    gpus: {model: T4, count: 2}\n"),
              HasSubstr("needs model, count and memoryMiB"));
  EXPECT_THAT(ClusterError("nodes:\n  - name: a\n    gpus: {model: T4, count: many, memoryMiB: 1}\n"),
              HasSubstr("count must be a whole number, not \"many\""));
  EXPECT_THAT(ClusterError("nodes:\n  - name: a\n    gpus: {model: T4, count: 2, memoryMiB: 1}\n"
                           "    links: [[X, PIX], [PIX, Y]]\n"),
              HasSubstr("unknown link level \"Y\""));
  EXPECT_THAT(ClusterError("nodes:\n  - name: a\n    gpus: {model: T4, count: 3, memoryMiB: 1}\n"
                           "    topology: |\n      GPU0 GPU1\n      GPU0 X PIX\n      GPU1 PIX X\n"),
              HasSubstr("topology describes 2 GPUs but the node has 3"));
  EXPECT_THAT(ClusterError("nodes:\n  - {name: a}\n  - {name: a}\n"), HasSubstr("node a appears twice"));
  EXPECT_THAT(ClusterError("kind: Pod\nnodes: []\n"), HasSubstr("a cluster file has kind: Cluster"));
  EXPECT_THAT(ClusterError("nodes: []\nquotas:\n  - {namespace: a, model: T4, gpus: lots}\n"),
              HasSubstr("gpus must be a number of GPUs"));
  EXPECT_THAT(ClusterError("nodes: []\nquotas:\n  - {namespace: a, model: T4, gpus: .nan}\n"),
              HasSubstr("gpus must be a number of GPUs between 0 and 1000000"));
}

TEST(WorkloadFileTest, BundledExample) {
  absl::StatusOr<std::vector<core::PodSpec>> pods = ParseWorkloadFile(Example("pods-demo.yaml"));
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_GE(pods->size(), 10u);
  EXPECT_EQ((*pods)[0].name, "chat-infer-0");
  EXPECT_EQ((*pods)[5].uid, "default/chat-infer-5");
  EXPECT_EQ((*pods)[0].containers[0].limits.at("tessera.dev/gpu-cores"), "40");
  for (const core::PodSpec& p : *pods) EXPECT_TRUE(core::ParsePodRequest(p).ok()) << p.name;
}

TEST(WorkloadFileTest, KubernetesStyleResources) {
  absl::StatusOr<std::vector<core::PodSpec>> pods = ParseWorkloadFile(R"(
pods:
  - name: p
    containers:
      - name: c
        resources:
          limits: {tessera.dev/gpu: 1}
          requests: {cpu: 500m}
)");
  ASSERT_TRUE(pods.ok()) << pods.status();
  EXPECT_EQ((*pods)[0].containers[0].requests.at("cpu"), "500m");
  EXPECT_EQ((*pods)[0].ns, "default");
}

TEST(WorkloadFileTest, Errors) {
  auto error = [](const std::string& yaml) {
    absl::StatusOr<std::vector<core::PodSpec>> p = ParseWorkloadFile(yaml, "w.yaml");
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : std::string(p.status().message());
  };
  EXPECT_THAT(error("pods:\n  - containers: []\n"), HasSubstr("a pod needs a name"));
  EXPECT_THAT(error("pods:\n  - name: p\n"), HasSubstr("a pod needs a list of containers"));
  EXPECT_THAT(error("pods:\n  - {name: p, containers: []}\n  - {name: p, containers: []}\n"),
              HasSubstr("pod default/p appears twice"));
  EXPECT_THAT(error("pods:\n  - name: p\n    containers:\n      - {name: c, privileged: maybe}\n"),
              HasSubstr("w.yaml line 4: privileged must be true or false"));
}

// Small files that expanded to gigabytes (issue 25, item 9): each is refused with the limit it passed.
std::string WorkloadError(const std::string& yaml) {
  absl::StatusOr<std::vector<core::PodSpec>> p = ParseWorkloadFile(yaml, "w.yaml");
  EXPECT_FALSE(p.ok()) << p->size() << " pods";
  return p.ok() ? "" : std::string(p.status().message());
}

TEST(FileExpansionTest, ReplicasOfAliasedContainersAreCappedBeforeTheyAreMade) {
  // 4 KB: a million replicas of a pod with 1,000 aliased containers.
  std::string yaml =
      "pods:\n  - name: p\n    replicas: 1000000\n    containers: [&c {name: m, resources: {cpu: 1}}";
  for (int i = 1; i < 1000; ++i) yaml += ", *c";
  yaml += "]\n";
  EXPECT_LT(yaml.size(), 4100u);
  EXPECT_THAT(WorkloadError(yaml), HasSubstr("w.yaml line 2: the file has more than 2000000 containers"));
  // Pods are capped too, counted over the whole file.
  EXPECT_THAT(WorkloadError("pods:\n  - {name: a, replicas: 600000, containers: []}\n"
                            "  - {name: b, replicas: 600000, containers: []}\n"),
              HasSubstr("w.yaml line 3: the file has more than 1000000 pods"));
  // And their bytes: 200 KB of annotation times 10,000 replicas.
  EXPECT_THAT(WorkloadError("pods:\n  - name: p\n    replicas: 10000\n    annotations: {a: " +
                            std::string(200000, 'x') + "}\n    containers: [{name: m}]\n"),
              HasSubstr("the file's pods would take more than 512 MiB in memory"));
}

TEST(FileExpansionTest, AliasesAreCountedOncePerUse) {
  // A 1 MB annotation aliased 100 times: 100 MB from a 1 MB file.
  std::string yaml =
      "pods:\n  - name: p\n    annotations:\n      a0: &big " + std::string(1 << 20, 'x') + "\n";
  for (int i = 1; i < 100; ++i) yaml += "      a" + std::to_string(i) + ": *big\n";
  yaml += "    containers: [{name: m}]\n";
  EXPECT_THAT(WorkloadError(yaml), HasSubstr("the document's aliases expand it to more than"));
  // Aliases of aliases ("billion laughs"): refused as it is read, before anything is built.
  std::string laughs = "a0: &a0 [~, ~, ~, ~, ~, ~, ~, ~, ~, ~]\n";  // nulls: no bytes, only values
  for (int i = 1; i < 9; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    laughs += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k) laughs += ", " + prev;
    laughs += "]\n";
  }
  EXPECT_THAT(ClusterError(laughs), HasSubstr("the document has more than 2000000 values"));
  // A few aliases are what they are for.
  absl::StatusOr<ClusterFile> ok = ParseClusterFile(
      "nodes:\n  - {name: a, gpus: &g {model: T4, count: 4, memoryMiB: 15360}}\n  - {name: b, gpus: *g}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->nodes.size(), 2u);
}

TEST(FileExpansionTest, ClusterNodesAndGpusAreCapped) {
  EXPECT_THAT(ClusterError("nodes:\n  - {name: a, replicas: 30000}\n  - {name: b, replicas: 30000}\n"),
              HasSubstr("c.yaml line 3: the file has more than 50000 nodes"));
  EXPECT_THAT(
      ClusterError("nodes:\n  - {name: a, replicas: 10000, gpus: {model: T4, count: 64, memoryMiB: 1}}\n"),
      HasSubstr("c.yaml line 2: the file has more than 400000 GPUs"));
  // Replicas still get their own names and UUIDs from one parse.
  absl::StatusOr<ClusterFile> f = ParseClusterFile(
      "nodes:\n  - name: n\n    replicas: 2\n    gpus: [{uuid: GPU-x, model: T4, memoryMiB: 1}, {model: T4, "
      "memoryMiB: 1}]\n");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->nodes.size(), 2u);
  EXPECT_EQ(f->nodes[1].name.value(), "n-1");
  EXPECT_EQ(f->nodes[1].gpus[0].uuid.value(), "GPU-x-1");
  EXPECT_EQ(f->nodes[1].gpus[1].uuid.value(), "GPU-n-1-1");
}

TEST(FileExpansionTest, DeepNestingSaysTheLimitAndTheLine) {
  const std::string deep =
      "pods:\n  - name: p\n    annotations: " + std::string(100, '[') + std::string(100, ']') + "\n";
  EXPECT_THAT(WorkloadError(deep),
              HasSubstr("w.yaml line 3: lists and maps are nested more than 64 levels deep"));
  // Deeper than yaml-cpp's own guard, which used to say only "bad file".
  const std::string deeper = "nodes: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  EXPECT_THAT(ClusterError(deeper),
              HasSubstr("c.yaml line 1: lists and maps are nested more than 64 levels deep"));
}

TEST(FileExpansionTest, AnAliasInsideItsOwnAnchorIsRefused) {
  EXPECT_THAT(ClusterError("nodes: &n [*n]\n"),
              HasSubstr("c.yaml line 1: an alias refers to a node that contains it"));
}

TEST(FileExpansionTest, OversizedTextIsRefused) {
  EXPECT_THAT(ClusterError(std::string((32 << 20) + 1, '#')),
              HasSubstr("the limit for a YAML or JSON file is 32 MiB"));
}

}  // namespace
}  // namespace tessera::formats
