/* The local nodes' pause image: holds a pod's namespaces, reaps zombies (it is PID 1 when the pod
 * shares a PID namespace) and exits on SIGTERM or SIGINT. Built static by containerd.sh. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(sig == SIGTERM ? 0 : 2); }

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction sa = {0};
	sa.sa_handler = stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	for (;;) {
		pause();
	}
	return 0;
}
