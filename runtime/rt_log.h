/* runtime/rt_log.h -- training progress: a one-line progress display and a JSON-lines log.
 *
 * Invariants:
 *  - rt_progress_format is a pure formatter (tests compare its output); rt_progress_step
 *    prints one line per call, or, when the stream is a terminal, redraws one line
 *    with '\r' and a bar, ending it with '\n' at the last step or rt_progress_done.
 *  - The JSON-lines log holds one JSON object per line: first {"config": {...}} with
 *    every pair the caller added, then one record per step with "step" (from 0),
 *    "loss", "lr", "grad_norm", "tokens_per_s", "ms", "mfu" when known, and the
 *    caller's extra fields. Each line is flushed when written, so a killed run
 *    leaves complete lines. Non-finite numbers are written as null (JSON has no NaN).
 *  - Neither object is thread-safe: one rank (thread) owns each. */
#ifndef PARC_RT_LOG_H
#define PARC_RT_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
  int64_t step;          /* from 0 */
  double loss;           /* the objective that is differentiated */
  double lr;
  double grad_norm;      /* before clipping */
  double tokens_per_s;
  double ms;             /* wall time of this step */
  double mfu;            /* model FLOPs utilisation in [0, 1]; < 0: unknown (CPU) */
} RtStepStats;

/* ---- progress line ---- */

typedef struct {
  FILE *out;
  int64_t total_steps;
  int tty;               /* redraw with '\r' and a bar */
  int open_line;         /* a '\r' line is on screen without its '\n' */
  double avg_ms;         /* smoothed step time for the ETA */
  int64_t calls;
} RtProgress;

/* tty = -1: detect with isatty(out); 0 or 1 force it. */
void rt_progress_init(RtProgress *p, FILE *out, int64_t total_steps, int tty);
/* Formats the line for stats, e.g.
 *   step   12/1000 | loss 3.2134 | lr 6.00e-04 | norm 1.234 | 12.3k tok/s | 45.6 ms | eta 0:12:34
 * eta_ms < 0 prints "eta -:--:--"; bar_width > 0 prefixes "[####......]  1% ".
 * Returns the length (as snprintf: the text is cut to cap - 1). */
int rt_progress_format(char *buf, size_t cap, const RtStepStats *s, int64_t total_steps,
                       double eta_ms, int bar_width);
void rt_progress_step(RtProgress *p, const RtStepStats *s);
/* Ends a redrawn line so that later output starts on a fresh line. */
void rt_progress_done(RtProgress *p);
/* h:mm:ss of a duration in milliseconds ("-:--:--" if negative or not finite). */
void rt_format_hms(char *buf, size_t cap, double ms);

/* ---- JSON-lines log ---- */

typedef struct RtLog RtLog;

/* Opens path for writing (append != 0 keeps earlier lines, e.g. on resume). */
int rt_log_open(RtLog **out, const char *path, int append);
/* Adds a pair to the config record; only before the first step record. */
int rt_log_config_num(RtLog *log, const char *key, double value);
int rt_log_config_str(RtLog *log, const char *key, const char *value);
/* Writes the config record now (otherwise it is written before the first step). */
int rt_log_write_config(RtLog *log);
/* One step record; extra_keys/extra_vals (n_extra of them) are added after the
 * standard fields, e.g. {"ce_loss"}, {3.21}. */
int rt_log_step(RtLog *log, const RtStepStats *s, const char *const *extra_keys,
                const double *extra_vals, int n_extra);
/* One MoE layer's routing in a step, global (summed over every data-parallel
 * rank and microbatch): the choices each expert kept, the choices dropped by
 * its capacity, and the layer's auxiliary loss terms as added to the
 * objective (the step's value: mean over microbatches). */
typedef struct {
  int layer, experts;
  const double *tokens;      /* experts counts */
  double dropped, aux;       /* aux: the load-balancing term */
  double z;                  /* the router z-loss term (has_z) */
  int has_z;                 /* 1: the layer has a router z-loss */
} RtMoeLayerStats;

/* rt_log_step plus, when nmoe > 0, "moe": [{"layer": l, "tokens": [...],
 * "dropped": d, "aux": a}, ...] in the record, and "z": the router z-loss term
 * in a layer that has one. */
int rt_log_step_moe(RtLog *log, const RtStepStats *s, const char *const *extra_keys,
                    const double *extra_vals, int n_extra, const RtMoeLayerStats *moe, int nmoe);
/* The compact text of the layers' routing, e.g.
 *   moe L0 tok 30/34/32/32 drop 0 aux 0.0201 | L1 tok 31/33/32/32 drop 0 aux 0.0200
 * (" z 0.00412" after aux in a layer with a router z-loss).
 * Returns the length (as snprintf). */
int rt_moe_format(char *buf, size_t cap, const RtMoeLayerStats *moe, int nmoe);
/* Writes a pending config record, closes the file; returns the status of the close. */
int rt_log_close(RtLog *log);

#endif
