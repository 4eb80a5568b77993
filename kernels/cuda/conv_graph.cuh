/* conv_graph.cuh -- conv.cu's entry into conv_graph.cu: a convolution over the whole batch
 * through cuDNN's graph (backend) API. Not in the emulated build (no cuDNN there). */
#ifndef LUMEN_CONV_GRAPH_CUH
#define LUMEN_CONV_GRAPH_CUH
#include "cuda.cuh"
#include "ops/conv.h"

enum { CONV_GRAPH_FWD = 0, CONV_GRAPH_BWD_DATA = 1, CONV_GRAPH_BWD_FILTER = 2 };

#ifndef LM_CUDA_EMU
#include <cudnn.h>
/* Run one convolution of the whole batch g->N on the graph API: op CONV_GRAPH_FWD (y from x, w),
   CONV_GRAPH_BWD_DATA (x is grad_x, from w and y = grad_out) or CONV_GRAPH_BWD_FILTER (w is
   grad_w, from x and y = grad_out), dense in the layout (nhwc), beta 0. Returns 1 when it ran
   (*st: its status; *impl: the LUMEN_VERBOSE name), 0 when the graph API declined the case
   (switched off, no engine, a plan that does not finalize or execute, no memory for its
   workspace: remembered per shape key), and the caller takes the legacy API; no error is left
   set then. */
int lm_conv_graph_run(int k, cudnnHandle_t h, int op, const conv_geom *g, int dt, int nhwc,
                      void *x, void *w, void *y, lm_status *st, const char **impl);
#endif
#endif
