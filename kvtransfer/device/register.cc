// Registration of the device transport; see register.h.
#include "kvtransfer/device/register.h"

#include "kvtransfer/device/cuda_staging.h"
#include "kvtransfer/device/device_receiver.h"
#include "kvtransfer/device/device_sender.h"
#include "kvtransfer/transport_factory.h"

namespace pdserve::kvtransfer::device {

void RegisterDeviceKvTransports(const DeviceTransportOptions& options) {
  if (absl::StatusOr<std::shared_ptr<CudaKvStaging>> staging = CudaKvStaging::Create();
      staging.ok()) {
    SetKvDeviceStaging(std::move(*staging));
  } else {
    cudaGetLastError();  // no device: not an error of later work
  }
  RegisterKvTransport("nccl", {.sender = [options](std::span<const engine::KvRegion> regions)
                                   -> absl::StatusOr<std::unique_ptr<KvSender>> {
                                 return DeviceKvSender::Create(regions, options);
                               },
                               .receiver = [options](const std::string& host, int port,
                                                     std::span<const engine::KvRegion> regions)
                                   -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
                                 return DeviceKvReceiver::Create(host, port, regions, options);
                               }});
}

}  // namespace pdserve::kvtransfer::device
