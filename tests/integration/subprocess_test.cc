// The test harness's Subprocess: a test process that crashes ends the
// servers it started instead of leaving them running.
#include "tests/integration/subprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace pdserve::testing {
namespace {

// A child process starts a long `sleep` through Subprocess, reports its pid
// and then dies of `sig`; the sleep must not outlive it.
void ExpectChildrenEndedOn(int sig) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t tester = fork();
  ASSERT_GE(tester, 0);
  if (tester == 0) {
    close(fds[0]);
    Subprocess sleeper;
    pid_t pid = -1;
    if (sleeper.Start({"/bin/sleep", "300"}, ::testing::TempDir() + "/subprocess_sleep.log").ok()) {
      pid = sleeper.pid();
    }
    if (write(fds[1], &pid, sizeof pid) != sizeof pid) _exit(3);
    raise(sig);
    _exit(4);  // not reached
  }
  close(fds[1]);
  pid_t sleeper = -1;
  ASSERT_EQ(read(fds[0], &sleeper, sizeof sleeper), static_cast<ssize_t>(sizeof sleeper));
  close(fds[0]);
  ASSERT_GT(sleeper, 0);
  int status = 0;
  ASSERT_EQ(waitpid(tester, &status, 0), tester);
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), sig);
  // The sleep was the dead tester's child: ended by SIGKILL, it is gone or
  // a zombie waiting for whoever adopted it, not a running process.
  EXPECT_TRUE(WaitUntilExited(sleeper, absl::Seconds(30))) << "sleep " << sleeper << " still runs";
  if (kill(sleeper, 0) == 0) kill(sleeper, SIGKILL);  // (never leave it behind)
}

TEST(SubprocessTest, AnAbortEndsTheChildren) { ExpectChildrenEndedOn(SIGABRT); }

TEST(SubprocessTest, ATerminationEndsTheChildren) { ExpectChildrenEndedOn(SIGTERM); }

TEST(SubprocessTest, StoppedChildIsReaped) {
  Subprocess child;
  ASSERT_TRUE(child.Start({"/bin/sleep", "300"}, ::testing::TempDir() + "/subprocess_stop.log").ok());
  const pid_t pid = child.pid();
  EXPECT_EQ(child.Stop(absl::Seconds(10)), -SIGTERM);
  EXPECT_FALSE(child.running());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), -1);  // reaped: no longer a child of ours
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace pdserve::testing
