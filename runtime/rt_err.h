/* runtime/rt_err.h -- the runtime's error channel.
 *
 * Invariants:
 *  - A failing rt_ call returns a negative status (RT_ERR) or NULL, and leaves in
 *    this thread's last-error buffer exactly one line (no newline) that names the
 *    file / tensor / value at fault and says what to do.
 *  - Successful calls do not touch the buffer, so a message stays until the next
 *    failure in the same thread (ranks that are threads never see each other's errors).
 *  - Library code never aborts or exits; it reports through this channel.
 *  - RT_ERR_SETUP (also negative, so `if (rc)` and `rc < 0` still catch it) marks a
 *    refusal of the user's environment rather than a fault of the program: a GPU
 *    too small for the plan, fewer GPUs than the mesh needs, a bad PARC_*
 *    variable.  Its message says what to change; a trainer reports it as bad
 *    setup (exit code 1), never as an internal error. */
#ifndef PARC_RT_ERR_H
#define PARC_RT_ERR_H

#define RT_OK 0
#define RT_ERR (-1)
#define RT_ERR_SETUP (-2)  /* the user's setup cannot run this (see above) */
#define RT_ERR_MAX 1024   /* longer messages are cut with "..." */

/* This thread's last error message; "" if there was none. */
const char *rt_last_error(void);
void rt_clear_error(void);

/* Records a printf-formatted message (newlines become spaces) and returns RT_ERR. */
int rt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same, returning RT_ERR_SETUP. */
int rt_fail_setup(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
