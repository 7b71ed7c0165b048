/* codegen/timeline.h -- the simulated pipeline schedule as pictures:
 * `parc --emit timeline` (SVG) and `--emit trace` (Chrome trace JSON). */
#ifndef PARC_TIMELINE_H
#define PARC_TIMELINE_H

#include <stdio.h>

#include "passes/passes.h"

/* An SVG picture: one row per stage, an F/B/W box per action labelled with
 * its microbatch (hover for the chunk and times), idle time as grey, a time
 * axis in ms.  Returns 0, or -1 when the plan holds no simulation or out
 * is not writable. */
int cg_timeline_svg(FILE *out, const char *model, const PpPlan *p);

/* Chrome trace JSON (the Trace Event Format Perfetto opens): one complete
 * event (ph "X") per action of every stage's list, SEND and RECV too (a
 * RECV lasts as long as its stage waits), pid = stage, tid 0, ts and dur
 * in microseconds; process names "stage N".  Returns 0 or -1. */
int cg_timeline_trace(FILE *out, const char *model, const PpPlan *p);

#endif
