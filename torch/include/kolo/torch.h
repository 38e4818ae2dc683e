// kolo's libtorch frontend: everything a training program needs.
//
//   kolo::init_torch();                                // kolo/torch/c10d_store.h (or kolo::init())
//   kolo::broadcast_parameters(*model, /*root=*/0);     // kolo/torch/broadcast.h
//   kolo::DistributedSampler sampler(n, {});            // kolo/torch/sampler.h
//   double loss = kolo::metric_average(local, "loss");  // kolo/torch/metrics.h
//   kolo::DistributedOptimizer opt(adam, model->named_parameters());  // kolo/torch/optimizer.h
//   kolo::ZeroOptimizer zero(adam, *model, {});         // kolo/torch/zero.h (sharded)
//   auto opt = kolo::make_parallel_optimizer(adam, *model, options);  // either, by zero_stage
//   kolo::elastic::TorchState state(*model, &adam, n);  // kolo/torch/elastic.h (elastic)
//   kolo::LAMB lamb(kolo::layerwise_param_groups(...));  // kolo/torch/lamb.h (large batches)
//   kolo::send(activation, rank + 1);                   // kolo/torch/p2p.h (point to point)
//   kolo::MirroredStrategy mirrored({.replicas = 2});   // kolo/torch/mirrored.h (replicas as
//   threads)
//
// See docs/torch.md. Each header can also be included on its own (they are
// lighter than <torch/torch.h>).
#pragma once

#include "kolo/core/batch_balancer.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/c10d_store.h"
#include "kolo/torch/checkpoint.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/lamb.h"
#include "kolo/torch/lars.h"
#include "kolo/torch/layerwise.h"
#include "kolo/torch/lr.h"
#include "kolo/torch/metrics.h"
#include "kolo/torch/mirrored.h"
#include "kolo/torch/mixed_precision.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/optimizer_factory.h"
#include "kolo/torch/p2p.h"
#include "kolo/torch/parallel_optimizer.h"
#include "kolo/torch/parameter_server.h"
#include "kolo/torch/pipeline.h"
#include "kolo/torch/ps_optimizer.h"
#include "kolo/torch/sampler.h"
#include "kolo/torch/tensor.h"
#include "kolo/torch/tensor_parallel.h"
#include "kolo/torch/torch_optimizer.h"
#include "kolo/torch/trainer.h"
#include "kolo/torch/zero.h"
