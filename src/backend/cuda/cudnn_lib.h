/* cudnn_lib.h: cuDNN, loaded with dlopen at the first use, for the files that call it (conv.cu's
 * convolutions through the legacy API, attention_cudnn.cu's fused attention through the backend API).
 *
 * libapex builds and links without cuDNN: the library comes from $APEX_CUDNN when set, else
 * libcudnn.so.9 on the loader's path (PyTorch's wheels ship it under site-packages/nvidia/cudnn/lib),
 * and a machine without it gets APEX_ERR_UNSUPPORTED saying how to point apex at it, while every op with
 * a path of apex's own keeps it. Calls go through function pointers typed from cudnn.h (C++: nvcc only). */
#ifndef APEX_CUDNN_LIB_H
#define APEX_CUDNN_LIB_H

#include <cudnn.h>

#include "apex/status.h"

#define APEX__CUDNN_FUNCS(X)                                                                                \
  X(cudnnCreate) X(cudnnSetStream) X(cudnnGetErrorString) X(cudnnGetVersion) X(cudnnCreateTensorDescriptor) \
  X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor) X(cudnnCreateFilterDescriptor)              \
  X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) X(cudnnCreateConvolutionDescriptor)         \
  X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)    \
  X(cudnnGetConvolutionForwardAlgorithm_v7) X(cudnnGetConvolutionForwardWorkspaceSize)                      \
  X(cudnnConvolutionForward) X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                 \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize) X(cudnnConvolutionBackwardData)                           \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7) X(cudnnGetConvolutionBackwardFilterWorkspaceSize)        \
  X(cudnnConvolutionBackwardFilter) X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)        \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize) X(cudnnBackendExecute)

/* The loaded functions and the one handle (on apex's stream once apex__cudnn_ready said yes). */
typedef struct apex__cudnn_lib {
#define APEX__CUDNN_DECLARE(f) decltype(&::f) f;
  APEX__CUDNN_FUNCS(APEX__CUDNN_DECLARE)
#undef APEX__CUDNN_DECLARE
  cudnnHandle_t handle;
  size_t version; /* cudnnGetVersion(): 9xxyy */
  char why[512];  /* why cuDNN cannot be used; empty when loaded */
} apex__cudnn_lib;

extern apex__cudnn_lib apex__dnn;

/* Loads cuDNN on the first call; then sets its handle's stream to apex's. APEX_OK, or
 * APEX_ERR_UNSUPPORTED naming fn and why cuDNN is not there, or APEX_ERR_DEVICE when the stream could
 * not be set. */
apex_status apex__cudnn_ready(const char *fn);

#endif
