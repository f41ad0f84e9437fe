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

}  // namespace
}  // namespace tessera::formats
