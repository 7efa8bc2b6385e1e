/*
 * memcached's wait: one epoll set holding a pipe (its notify pipe, quiet
 * nearly always) and a socket that answers, waited on once per answer.
 * Against a Linux TCP echo server at HOST:PORT, ROUNDS times: a byte out,
 * a wait that must report the socket alone; every 25th round a thread
 * writes the pipe a little later instead, and the wait must report the
 * pipe alone (so a kernel descriptor wakes the waiter again and again);
 * once both are ready together. At the end no thread of the blocking pool
 * may exist: under `ginza run` a quiet pipe in the set must cost no
 * hand-off to the pool per wait (on Linux there is no pool at all).
 *
 *     epoll_quiet_pipe HOST PORT ROUNDS
 */
#include "net.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/epoll.h>

struct later {
	int fd;
	int delay_us;
};

static void *write_later(void *arg)
{
	struct later *l = arg;
	usleep((useconds_t)l->delay_us);
	CHECK(write(l->fd, "p", 1) == 1, "late write to the pipe: %s", strerror(errno));
	return NULL;
}

/* Threads of this process whose name is `name`. */
static int threads_named(const char *name)
{
	DIR *d = opendir("/proc/self/task");
	CHECK(d != NULL, "opendir /proc/self/task: %s", strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char path[300], comm[32] = { 0 };
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue; /* the thread ended meanwhile */
		if (fgets(comm, sizeof comm, f) != NULL) {
			comm[strcspn(comm, "\n")] = 0;
			n += strcmp(comm, name) == 0;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/* One wait; it must report exactly `fd`, readable. */
static void expect_only(int ep, int fd, const char *what, int round)
{
	struct epoll_event ev[4];
	int n = epoll_wait(ep, ev, 4, 5000);
	CHECK(n == 1 && ev[0].data.fd == fd && (ev[0].events & EPOLLIN),
	      "round %d: waiting for %s gave %d events (first fd %d, events %#x): %s", round, what,
	      n, n > 0 ? ev[0].data.fd : -1, n > 0 ? ev[0].events : 0, strerror(errno));
}

int main(int argc, char **argv)
{
	CHECK(argc == 4, "usage: %s HOST PORT ROUNDS", argv[0]);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
	CHECK(inet_pton(AF_INET, argv[1], &to.sin_addr) == 1, "bad HOST %s", argv[1]);
	int rounds = atoi(argv[3]);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "socket: %s", strerror(errno));
	CHECK(connect(s, (struct sockaddr *)&to, sizeof to) == 0, "connect: %s", strerror(errno));
	int p[2];
	CHECK(pipe(p) == 0, "pipe: %s", strerror(errno));
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event a = { .events = EPOLLIN, .data.fd = p[0] };
	struct epoll_event b = { .events = EPOLLIN, .data.fd = s };
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &a) == 0 && epoll_ctl(ep, EPOLL_CTL_ADD, s, &b) == 0,
	      "EPOLL_CTL_ADD: %s", strerror(errno));
	char c;
	for (int i = 0; i < rounds; i++) {
		if (i % 25 == 24) {
			struct later l = { p[1], 2000 };
			pthread_t t;
			PT(pthread_create(&t, NULL, write_later, &l));
			expect_only(ep, p[0], "the pipe", i);
			PT(pthread_join(t, NULL));
			CHECK(read(p[0], &c, 1) == 1 && c == 'p', "round %d: reading the pipe", i);
			continue;
		}
		CHECK(write(s, "e", 1) == 1, "round %d: write: %s", i, strerror(errno));
		expect_only(ep, s, "the socket's echo", i);
		CHECK(read(s, &c, 1) == 1 && c == 'e', "round %d: the echo", i);
	}
	/* Both at once: both reported by one wait. */
	CHECK(write(p[1], "p", 1) == 1 && write(s, "e", 1) == 1, "writes: %s", strerror(errno));
	struct epoll_event ev[4];
	int got = 0, seen = 0;
	/* The pipe is ready at once, the echo a round trip later. */
	uint64_t deadline = now_ns() + 5000000000ull;
	while (seen != 3 && now_ns() < deadline) {
		got = epoll_wait(ep, ev, 4, 5000);
		CHECK(got >= 1, "waiting for both: %d %s", got, strerror(errno));
		for (int k = 0; k < got; k++)
			seen |= ev[k].data.fd == p[0] ? 1 : ev[k].data.fd == s ? 2 : 0;
	}
	CHECK(seen == 3, "the pipe and the socket both ready: seen %d", seen);
	CHECK(read(p[0], &c, 1) == 1 && read(s, &c, 1) == 1, "reading both");
	int pool = threads_named("ginza-blocking");
	CHECK(pool == 0, "%d blocking-pool threads after %d waits with a quiet pipe in the set", pool,
	      rounds);
	close(ep);
	close(p[0]);
	close(p[1]);
	close(s);
	PASS("epoll_quiet_pipe");
}
