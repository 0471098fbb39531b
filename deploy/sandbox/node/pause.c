/*
 * The pod sandbox's process: what containerd runs first in every pod of the
 * sandbox's real node, to hold the pod's namespaces while its containers
 * come and go (the kubelet's `sandbox_image`). It does what Kubernetes'
 * build/pause/linux/pause.c does: sleep in pause() forever, exit 0 on
 * SIGINT or SIGTERM, and reap every child it inherits as the PID namespace's
 * init (pods that share their process namespace re-parent orphans to it).
 *
 * Built by poller/sandbox/images.py with `gcc -static` into a FROM scratch
 * image, because registry.k8s.io (containerd's default pause image) is out
 * of reach on the machines this project is tested on.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "lmeval-poller pause 1\n"

static void say(const char *text)
{
	/* write(2) is async-signal-safe; stdio is not. */
	ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
	(void)ignored;
}

static void on_stop(int signo)
{
	say(signo == SIGINT ? "pause: SIGINT, exiting\n" : "pause: SIGTERM, exiting\n");
	_exit(0);
}

static void on_child(int signo)
{
	int saved = errno;
	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

static int handle(int signo, void (*handler)(int), int flags)
{
	struct sigaction action;
	memset(&action, 0, sizeof(action));
	action.sa_handler = handler;
	action.sa_flags = flags;
	sigemptyset(&action.sa_mask);
	return sigaction(signo, &action, NULL);
}

int main(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
		say(VERSION);
		return 0;
	}
	if (getpid() != 1)
		say("pause: warning: not the first process of its PID namespace\n");
	if (handle(SIGINT, on_stop, 0) < 0 || handle(SIGTERM, on_stop, 0) < 0 ||
	    handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
		say("pause: sigaction failed\n");
		return 1;
	}
	for (;;)
		pause();
	say("pause: pause() returned\n");
	return 42;
}
