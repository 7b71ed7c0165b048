/* codegen/timeline.c -- see timeline.h.  Both files draw the events of the
 * schedule checker's simulation (PpPlan.sim), nothing recomputed here. */
#include "codegen/timeline.h"

#include <math.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

enum { LEFT = 80, RIGHT = 20, TOP = 46, ROW = 30, GAP = 8, PLOT_W = 1200 };

static const char *const fill_of[3] = {"#4e79a7", "#59a14f", "#f28e2b"}; /* F, B, W */
static const char *const dark_of[3] = {"#2c4f75", "#3a6e33", "#b5620f"}; /* odd chunk rounds */

/* 1, 2 or 5 times a power of ten, about span / 10. */
static double tick_step(double span) {
  double raw = span / 10, p = pow(10, floor(log10(raw)));
  return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

int cg_timeline_svg(FILE *out, const char *model, const PpPlan *p) {
  const PpSim *sim = &p->sim;
  const PpSchedule *s = &p->sched;
  if (!sim->events || sim->makespan <= 0) return -1;
  int P = s->nstages;
  double ms = sim->makespan * 1e3, scale = PLOT_W / ms;
  int width = LEFT + PLOT_W + RIGHT, axis_y = TOP + P * (ROW + GAP), height = axis_y + 60;
  fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
          "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n", width, height, width, height);
  fprintf(out, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
  fprintf(out, "<text x=\"%d\" y=\"20\" font-size=\"14\">%s: %s, %d stages", LEFT, model,
          pp_schedule_name[s->kind], P);
  if (s->nvirtual > 1) fprintf(out, " x %d virtual", s->nvirtual);
  fprintf(out, ", %d microbatches; step %.3f ms; bubble %.3f simulated, %.3f analytic</text>\n",
          s->microbatches, ms, sim->bubble, p->analytic_bubble);
  /* legend */
  static const char *const what[3] = {"F forward", "B backward (input grad)", "W weight grad"};
  int lx = LEFT;
  for (int k = 0; k < 3; k++) {
    if (k == PP_W && !s->split_w) continue;
    const char *label = k == PP_B && !s->split_w ? "B backward" : what[k];
    fprintf(out, "<rect x=\"%d\" y=\"28\" width=\"12\" height=\"10\" fill=\"%s\"/>"
            "<text x=\"%d\" y=\"37\" font-size=\"11\">%s</text>\n", lx, fill_of[k], lx + 16, label);
    lx += 190;
  }
  fprintf(out, "<rect x=\"%d\" y=\"28\" width=\"12\" height=\"10\" fill=\"#e4e4e4\"/>"
          "<text x=\"%d\" y=\"37\" font-size=\"11\">idle</text>\n", lx, lx + 16);
  /* rows: grey background is idle; boxes on top */
  for (int st = 0; st < P; st++) {
    int y = TOP + st * (ROW + GAP);
    fprintf(out, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"end\">stage %d</text>\n",
            LEFT - 8, y + ROW / 2 + 4, st);
    fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#e4e4e4\"/>\n", LEFT,
            y, PLOT_W, ROW);
  }
  for (int e = 0; e < sim->nevents; e++) {
    const PpEvent *ev = &sim->events[e];
    const PpAction *a = &s->actions[ev->stage][ev->index];
    if (a->kind != PP_F && a->kind != PP_B && a->kind != PP_W) continue;
    double x = LEFT + ev->start * 1e3 * scale, w = (ev->end - ev->start) * 1e3 * scale;
    int y = TOP + ev->stage * (ROW + GAP), round = a->chunk / P;
    char name[80];
    fprintf(out, "<g><title>%s: %.4f-%.4f ms</title><rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
            "height=\"%d\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"/>",
            pp_action_str(a, name, sizeof name), ev->start * 1e3, ev->end * 1e3, x, y,
            w > 0.5 ? w : 0.5, ROW, (round % 2 ? dark_of : fill_of)[a->kind]);
    if (w >= 12)
      fprintf(out, "<text x=\"%.2f\" y=\"%d\" font-size=\"%d\" fill=\"white\" "
              "text-anchor=\"middle\">%d</text>", x + w / 2, y + ROW / 2 + 4, w >= 18 ? 11 : 8,
              a->mb);
    fprintf(out, "</g>\n");
  }
  /* time axis */
  double step = tick_step(ms);
  fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", LEFT, axis_y,
          LEFT + PLOT_W, axis_y);
  for (int i = 0; i * step <= ms * (1 + 1e-9); i++) {
    double x = LEFT + i * step * scale;
    fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"black\"/>"
            "<text x=\"%.2f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
            x, axis_y, x, axis_y + 5, x, axis_y + 18, i * step);
  }
  fprintf(out, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">time (ms)</text>\n",
          LEFT + PLOT_W / 2, axis_y + 38);
  fprintf(out, "</svg>\n");
  return ferror(out) ? -1 : 0;
}

int cg_timeline_trace(FILE *out, const char *model, const PpPlan *p) {
  const PpSim *sim = &p->sim;
  const PpSchedule *s = &p->sched;
  if (!sim->events) return -1;
  cJSON *root = cJSON_CreateObject();
  cJSON *ev = cJSON_AddArrayToObject(root, "traceEvents");
  for (int st = 0; st < s->nstages; st++) {
    char name[32];
    snprintf(name, sizeof name, "stage %d", st);
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "name", "process_name");
    cJSON_AddStringToObject(meta, "ph", "M");
    cJSON_AddNumberToObject(meta, "pid", st);
    cJSON_AddNumberToObject(meta, "tid", 0);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "args"), "name", name);
    cJSON_AddItemToArray(ev, meta);
  }
  for (int e = 0; e < sim->nevents; e++) {
    const PpEvent *x = &sim->events[e];
    const PpAction *a = &s->actions[x->stage][x->index];
    char name[80];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", pp_action_str(a, name, sizeof name));
    cJSON_AddStringToObject(o, "cat", pp_kind_name[a->kind]);
    cJSON_AddStringToObject(o, "ph", "X");
    cJSON_AddNumberToObject(o, "pid", x->stage);
    cJSON_AddNumberToObject(o, "tid", 0);
    cJSON_AddNumberToObject(o, "ts", x->start * 1e6);
    cJSON_AddNumberToObject(o, "dur", (x->end - x->start) * 1e6);
    cJSON *args = cJSON_AddObjectToObject(o, "args");
    cJSON_AddNumberToObject(args, "mb", a->mb);
    cJSON_AddNumberToObject(args, "chunk", a->chunk);
    cJSON_AddNumberToObject(args, "index", x->index);
    cJSON_AddItemToArray(ev, o);
  }
  cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
  cJSON *other = cJSON_AddObjectToObject(root, "otherData");
  cJSON_AddStringToObject(other, "model", model);
  cJSON_AddStringToObject(other, "schedule", pp_schedule_name[s->kind]);
  cJSON_AddNumberToObject(other, "stages", s->nstages);
  cJSON_AddNumberToObject(other, "virtual_stages", s->nvirtual);
  cJSON_AddNumberToObject(other, "microbatches", s->microbatches);
  cJSON_AddNumberToObject(other, "bubble_simulated", sim->bubble);
  cJSON_AddNumberToObject(other, "bubble_analytic", p->analytic_bubble);
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!text) return -1;
  fputs(text, out);
  fputc('\n', out);
  cJSON_free(text);
  return ferror(out) ? -1 : 0;
}
