/*
 * What a server sees of bad peers, as on Linux. The harness (sockets.rs)
 * plays the clients, one connection per phase, in this order:
 *
 * 1. a client that resets mid-request (SO_LINGER 0, close): the first
 *    call after the reset fails with ECONNRESET, a later write with EPIPE
 *    (MSG_NOSIGNAL), a later read gives 0;
 * 2. a client that half-closes: the server reads its bytes, then 0, and
 *    can still write to it;
 * 3. a client that never reads: non-blocking writes fill the buffers and
 *    fail with EAGAIN, and once the client's window is closed poll says
 *    the socket is not writable.
 *
 *     peer_errors PORT
 */
#include "net.h"

#include <poll.h>

static int accept_one(int l)
{
	int c = accept(l, NULL, NULL);
	CHECK(c >= 0, "accept: %s", strerror(errno));
	return c;
}

static void read_exact(int fd, char *buf, size_t n)
{
	size_t at = 0;
	while (at < n) {
		ssize_t r = read(fd, buf + at, n - at);
		CHECK(r > 0, "read: %zd %s", r, strerror(errno));
		at += (size_t)r;
	}
}

int main(int argc, char **argv)
{
	int l = listen_on(port_arg(argc, argv, 1), 0);
	say_ready();
	char buf[65536];

	/* 1. Reset mid-request. */
	int c = accept_one(l);
	read_exact(c, buf, 5);
	CHECK(!memcmp(buf, "hello", 5), "the request's start");
	ssize_t r = read(c, buf, sizeof buf);
	CHECK(r == -1 && errno == ECONNRESET, "read after the reset: %zd %s", r, strerror(errno));
	r = send(c, "x", 1, MSG_NOSIGNAL);
	CHECK(r == -1 && errno == EPIPE, "send after the reset: %zd %s", r, strerror(errno));
	r = read(c, buf, sizeof buf);
	CHECK(r == 0, "read once the reset was reported: %zd %s", r, strerror(errno));
	close(c);
	printf("reset\n");
	fflush(stdout);

	/* 2. Half-close. */
	c = accept_one(l);
	read_exact(c, buf, 3);
	CHECK(!memcmp(buf, "abc", 3), "the half-closed client's bytes");
	r = read(c, buf, sizeof buf);
	CHECK(r == 0, "read at the client's end of stream: %zd %s", r, strerror(errno));
	CHECK(write(c, "xyz", 3) == 3, "write to a half-closed client: %s", strerror(errno));
	close(c);
	printf("half-close\n");
	fflush(stdout);

	/* 3. Never reads. */
	c = accept_one(l);
	CHECK(fcntl(c, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	memset(buf, 'n', sizeof buf);
	size_t sent = 0;
	uint64_t end = now_ns() + 20000000000ull;
	/* Send until EAGAIN; the socket then stays unwritable once the
	 * client's window has closed (before that, acknowledgements free
	 * room again). */
	for (;;) {
		r = send(c, buf, sizeof buf, MSG_NOSIGNAL);
		if (r >= 0) {
			sent += (size_t)r;
		} else {
			CHECK(errno == EAGAIN, "send to a client that never reads: %s", strerror(errno));
			struct pollfd p = { .fd = c, .events = POLLOUT };
			int n = poll(&p, 1, 200);
			CHECK(n >= 0, "poll: %s", strerror(errno));
			if (n == 0)
				break;
			CHECK(p.revents == POLLOUT, "poll of a full socket: %#x", p.revents);
		}
		CHECK(now_ns() < end, "20 s of sends never filled the buffers (%zu bytes)", sent);
	}
	CHECK(sent > 0, "nothing was sent");
	printf("full after %zu bytes\n", sent);
	fflush(stdout);
	close(c);
	PASS("peer_errors");
}
