// `tessera run` as users run it: the real binary starts cuda_probe under the hook against the fake driver.
#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <array>
#include <string>

#include "hook/hook_process.h"

namespace tessera::testing {
namespace {

struct Output {
  int status;
  std::string text;
};

Output Shell(const std::string& command) {
  Output out{-1, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.text.append(buf.data(), n);
  out.status = pclose(p);
  return out;
}

std::string Tessera() {
  return std::string(TESSERA_BINARY_DIR) + "/bin/tessera";
}

TEST(TesseraRunTest, RunsTheCommandUnderTheLimits) {
  HookSandbox box;
  const std::string env = "env FAKECUDA_STATE=" + box.Path("fakegpu.state") +
                          " FAKECUDA_CONTEXT_BYTES=16MiB LD_LIBRARY_PATH=" + TESSERA_BINARY_DIR +
                          "/fakecuda ";
  const Output o =
      Shell(env + Tessera() + " run --gpu-memory 1GiB --gpu-cores 25 -- " + HookSandbox::ProbePath() +
            " proc12 init ctx totalmem meminfo alloc 1073741824 launch 1 1000000 sleep 50 "
            "launch 100 2000000 exit 3");
  ASSERT_TRUE(WIFEXITED(o.status)) << o.text;
  EXPECT_EQ(WEXITSTATUS(o.status), 3) << "the command's exit status comes back\n" << o.text;
  EXPECT_NE(o.text.find("totalmem 0 1073741824\n"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("meminfo 0 1056964608 1073741824\n"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("alloc 2 1073741824\n"), std::string::npos) << o.text;
  // 200 ms of kernels at 25%: at least 0.7 s.
  const size_t at = o.text.rfind("launch 0 ");
  ASSERT_NE(at, std::string::npos) << o.text;
  EXPECT_GE(std::stoull(o.text.substr(at + 9)), 700000000ull) << o.text;
}

TEST(TesseraRunTest, BadInputSaysWhatToDo) {
  Output o = Shell(Tessera() + " run --gpu-memory lots -- true");
  EXPECT_EQ(WEXITSTATUS(o.status), 2);
  EXPECT_NE(o.text.find("512MiB or 4GiB"), std::string::npos) << o.text;
  for (const char* zero : {"0", "0GiB"}) {  // zero never means "no limit" by accident
    o = Shell(Tessera() + " run --gpu-memory " + zero + " -- true");
    EXPECT_EQ(WEXITSTATUS(o.status), 2) << zero;
    EXPECT_NE(o.text.find("zero bytes"), std::string::npos) << o.text;
  }
  o = Shell(Tessera() + " run --gpu-cores 0 -- true");
  EXPECT_EQ(WEXITSTATUS(o.status), 2);
  o = Shell(Tessera() + " run --policy fair -- true");
  EXPECT_EQ(WEXITSTATUS(o.status), 2);
  EXPECT_NE(o.text.find("hard nor elastic"), std::string::npos) << o.text;
  o = Shell(Tessera() + " run --hook-library /nonexistent.so -- true");
  EXPECT_EQ(WEXITSTATUS(o.status), 2);
  o = Shell(Tessera() + " run -- /nonexistent-command");
  EXPECT_EQ(WEXITSTATUS(o.status), 127) << o.text;
}

}  // namespace
}  // namespace tessera::testing
