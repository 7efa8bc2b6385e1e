/*
 * Starting programs from a threaded program: fork + exec of /bin/true
 * (status 0) and of `sh -c "exit 5"` (status 5), posix_spawn of
 * `sh -c "exit 4"` and posix_spawnp of `true`, system("exit 3") (status
 * 3), popen of `echo` (its output read back), and finally an exec of this
 * program itself without fork, while threads run: the new image
 * ("after-exec") starts threads of its own and exits 0.
 */
#include "check.h"
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static atomic_int stop;

static void *busy(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop))
		usleep(100);
	return NULL;
}

static int wait_exit(pid_t pid, const char *what)
{
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "%s: waitpid: %s", what,
	      strerror(errno));
	CHECK(WIFEXITED(status), "%s: status %#x (signal %d)", what, status,
	      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	return WEXITSTATUS(status);
}

static void *twice(void *arg)
{
	return (void *)((uintptr_t)arg * 2);
}

static int after_exec(void)
{
	pthread_t t[4];
	for (uintptr_t i = 0; i < 4; i++)
		PT(pthread_create(&t[i], NULL, twice, (void *)i));
	for (uintptr_t i = 0; i < 4; i++) {
		void *r;
		PT(pthread_join(t[i], &r));
		CHECK(r == (void *)(i * 2), "after exec: thread %lu returned %p",
		      (unsigned long)i, r);
	}
	PASS("fork_exec (after exec)");
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "after-exec") == 0)
		return after_exec();

	pthread_t b[3];
	for (int i = 0; i < 3; i++)
		PT(pthread_create(&b[i], NULL, busy, NULL));

	for (int i = 0; i < 5; i++) {
		pid_t pid = fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0) {
			execl("/bin/true", "true", (char *)NULL);
			_exit(127);
		}
		CHECK(wait_exit(pid, "fork + exec /bin/true") == 0,
		      "/bin/true exited non-zero (127: exec failed)");
	}
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", "exit 5", (char *)NULL);
		_exit(127);
	}
	int st = wait_exit(pid, "fork + exec sh -c 'exit 5'");
	CHECK(st == 5, "sh -c 'exit 5' exited %d", st);

	char *sh_argv[] = {"sh", "-c", "exit 4", NULL};
	PT(posix_spawn(&pid, "/bin/sh", NULL, NULL, sh_argv, environ));
	st = wait_exit(pid, "posix_spawn sh -c 'exit 4'");
	CHECK(st == 4, "posix_spawn: sh -c 'exit 4' exited %d", st);
	char *true_argv[] = {"true", NULL};
	PT(posix_spawnp(&pid, "true", NULL, NULL, true_argv, environ));
	st = wait_exit(pid, "posix_spawnp true");
	CHECK(st == 0, "posix_spawnp true exited %d", st);

	int rc = system("exit 3");
	CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 3,
	      "system(\"exit 3\") returned %#x", rc);
	rc = system(NULL);
	CHECK(rc != 0, "system(NULL) says there is no shell");

	FILE *p = popen("echo popen-works", "r");
	CHECK(p, "popen: %s", strerror(errno));
	char line[64] = {0};
	CHECK(fgets(line, sizeof line, p), "popen: no output");
	CHECK(strcmp(line, "popen-works\n") == 0, "popen read \"%s\"", line);
	rc = pclose(p);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "pclose %#x", rc);

	/* exec without fork, threads still running. */
	fprintf(stderr, "exec'ing %s after-exec\n", "/proc/self/exe");
	fflush(stdout);
	execl("/proc/self/exe", argv[0], "after-exec", (char *)NULL);
	CHECK(0, "exec of /proc/self/exe: %s", strerror(errno));
}
