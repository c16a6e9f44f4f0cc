/*
 * The launcher's watch over mpirun (launch_supervise.c): runs argv (an
 * mpirun command line) as a child, passes its stderr through, forwards
 * SIGINT/SIGTERM/SIGHUP/SIGQUIT to it, and once its stderr says the job is
 * being ended (an MPI_Abort, a "cllm dist: ... ending" line) stops it if it
 * has not exited within grace_s seconds: mpirun waits forever for a daemon
 * on a host it can no longer reach. Returns the exit status to report
 * (mpirun's, 128 + signal when a signal ended it, 1 when it was stopped,
 * 127 when it could not be started).
 */
#ifndef CLLM_LAUNCH_SUPERVISE_H
#define CLLM_LAUNCH_SUPERVISE_H

#define LAUNCH_GRACE_S 15.0

int launch_supervise(char *const argv[], double grace_s);

#endif
