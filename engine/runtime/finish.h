// When a sequence stops: engine/types/finish_reason.h (the reason and
// CheckFinish, shared by the prefill worker, the decode worker, the router
// and the in-process generator so they agree exactly).
#pragma once

#include "engine/runtime/sampler.h"
#include "engine/types/finish_reason.h"
