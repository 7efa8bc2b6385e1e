/*
 * fork from a program whose threads are busy (malloc, a mutex, stdio):
 * the child allocates, prints through stdio (to a pipe the parent reads),
 * takes a mutex, starts and joins a thread, and exits 7; the parent's
 * waitpid sees 7. Forks come from the main thread and from another
 * thread; the parent's threads keep working throughout.
 */
#include "check.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 4
#define FORKS 10

static atomic_int stop;
static atomic_long work_done;
static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t child_lock = PTHREAD_MUTEX_INITIALIZER;
static long shared_total;

static void *worker(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		void *p = malloc(100 + (size_t)(atomic_load(&work_done) % 5000));
		CHECK(p, "malloc");
		memset(p, 0xab, 100);
		pthread_mutex_lock(&work_lock);
		shared_total++;
		pthread_mutex_unlock(&work_lock);
		free(p);
		atomic_fetch_add(&work_done, 1);
		if (atomic_load(&work_done) % 64 == 0)
			usleep(50);
	}
	return NULL;
}

static void *child_thread(void *arg)
{
	return (void *)((uintptr_t)arg * 2);
}

/* The child: exits 7 when everything worked, else another status. */
static void child(int out_fd)
{
	if (dup2(out_fd, STDOUT_FILENO) < 0)
		_exit(20);
	char *buf = malloc(1 << 20);
	if (!buf)
		_exit(21);
	for (int i = 0; i < (1 << 20); i++)
		buf[i] = (char)i;
	long sum = 0;
	for (int i = 0; i < (1 << 20); i += 4096)
		sum += buf[i];
	free(buf);
	if (pthread_mutex_lock(&child_lock) != 0)
		_exit(22);
	pthread_mutex_t fresh;
	if (pthread_mutex_init(&fresh, NULL) != 0 ||
	    pthread_mutex_lock(&fresh) != 0 ||
	    pthread_mutex_unlock(&fresh) != 0)
		_exit(23);
	if (pthread_mutex_unlock(&child_lock) != 0)
		_exit(24);
	pthread_t t;
	void *ret = NULL;
	if (pthread_create(&t, NULL, child_thread, (void *)21) != 0 ||
	    pthread_join(t, &ret) != 0 || ret != (void *)42)
		_exit(25);
	printf("child %d says hello (%ld)\n", (int)getpid(), sum);
	fflush(stdout);
	exit(7); /* exit(), not _exit(): atexit and stdio run in the child */
}

static void fork_one(const char *from)
{
	int fds[2];
	CHECK(pipe(fds) == 0, "pipe: %s", strerror(errno));
	fflush(stdout); /* or the child would print our buffered output */
	pid_t pid = fork();
	CHECK(pid >= 0, "fork from %s: %s", from, strerror(errno));
	if (pid == 0) {
		close(fds[0]);
		child(fds[1]);
	}
	close(fds[1]);
	char got[256] = {0};
	size_t n = 0;
	ssize_t r;
	while ((r = read(fds[0], got + n, sizeof got - 1 - n)) > 0)
		n += (size_t)r;
	close(fds[0]);
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 7,
	      "fork from %s: the child's status is %#x (exited %d, signal %d), "
	      "expected exit 7 (20-25: a step failed in the child)", from,
	      status, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
	      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	char want[64];
	snprintf(want, sizeof want, "child %d says hello", (int)pid);
	CHECK(strstr(got, want), "fork from %s: the child printed \"%s\"",
	      from, got);
}

static void *forker(void *arg)
{
	(void)arg;
	for (int i = 0; i < FORKS; i++)
		fork_one("a thread");
	return NULL;
}

int main(void)
{
	pthread_t w[WORKERS], f;
	for (int i = 0; i < WORKERS; i++)
		PT(pthread_create(&w[i], NULL, worker, NULL));
	for (int i = 0; i < FORKS; i++)
		fork_one("the main thread");
	PT(pthread_create(&f, NULL, forker, NULL));
	PT(pthread_join(f, NULL));
	long before = atomic_load(&work_done);
	usleep(20 * 1000);
	atomic_store(&stop, 1);
	for (int i = 0; i < WORKERS; i++)
		PT(pthread_join(w[i], NULL));
	CHECK(atomic_load(&work_done) > 0, "the workers did nothing");
	CHECK(shared_total == atomic_load(&work_done),
	      "workers counted %ld under the mutex, %ld in all", shared_total,
	      atomic_load(&work_done));
	(void)before;
	PASS("fork_child");
}
