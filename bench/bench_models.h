/* bench_models.h: the two training benchmarks' models, built in one place so that every benchmark
 * measures the same networks. */
#ifndef APEX_BENCH_MODELS_H
#define APEX_BENCH_MODELS_H

#include "apex/nn.h"

/* MLP 784-1024-1024-10 with ReLU, input [N, 784]. */
apex_module *bench_mlp(apex_model *m);
/* conv 32 + BN + ReLU + pool, conv 64 + BN + ReLU + pool, linear 128, linear 10; input [N, 1, 28, 28]. */
apex_module *bench_cnn(apex_model *m);

#endif
