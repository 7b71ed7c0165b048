/* codegen/report.h -- the compile report a user reads before asking for GPUs. */
#ifndef PARC_REPORT_H
#define PARC_REPORT_H

#include <stdio.h>

#include "passes/passes.h"

void cg_report(FILE *out, const IrModule *m, const Layout *lay, const Cost *c);

#endif
