/* apex.h: the whole public API of apex in one include. */
#ifndef APEX_APEX_H
#define APEX_APEX_H

#include "apex/amp.h"
#include "apex/amp_config.h"
#include "apex/autograd.h"
#include "apex/cpu.h"
#include "apex/dtype.h"
#include "apex/fp16_optimizer.h"
#include "apex/gpt_hf.h"
#include "apex/index.h"
#include "apex/kernels.h"
#include "apex/loss_scaler.h"
#include "apex/loss_scaler_config.h"
#include "apex/model_io.h"
#include "apex/models.h"
#include "apex/data.h"
#include "apex/ddp.h"
#include "apex/multi_tensor.h"
#include "apex/nn.h"
#include "apex/parallel.h"
#include "apex/nn_ops.h"
#include "apex/optim.h"
#include "apex/optim_options.h"
#include "apex/rng.h"
#include "apex/safetensors.h"
#include "apex/status.h"
#include "apex/tensor.h"
#include "apex/threads.h"
#include "apex/version.h"
#include "apex/zero.h"

#endif
