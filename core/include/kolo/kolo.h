// Umbrella header for kolo's core (no libtorch).
#pragma once

#include "kolo/core/batch_balancer.h"
#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/device.h"
#include "kolo/core/dtype.h"
#include "kolo/core/errors.h"
#include "kolo/core/parallel_grid.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "kolo/core/topology.h"
#include "kolo/version.h"
