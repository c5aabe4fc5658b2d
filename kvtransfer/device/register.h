// Makes the device transport available through kvtransfer's factory
// (transport_factory.h): kind "nccl" (NCCL between GPUs, CUDA IPC on one
// GPU), and CUDA host staging so that "tcp" can move device regions. Called
// once at start-up by binaries built with the CUDA libraries.
#pragma once

#include "absl/status/status.h"
#include "kvtransfer/device/device_common.h"

namespace pdserve::kvtransfer::device {

// Where no device is usable the staging is left out ("tcp" then refuses
// device regions, of which there are none); "nccl" reports the CUDA error
// when a sender or receiver is created.
void RegisterDeviceKvTransports(const DeviceTransportOptions& options = {});

}  // namespace pdserve::kvtransfer::device
