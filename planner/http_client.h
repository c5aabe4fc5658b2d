// A small blocking HTTP(S) client for the planner: the Prometheus HTTP API,
// the pods' /metrics and the Kubernetes API server. cpp-httplib underneath
// (Debian builds it with OpenSSL: https works).
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pdserve::planner {

struct HttpResponse {
  int status = 0;
  std::string body;
};

struct HttpOptions {
  absl::Duration timeout = absl::Seconds(10);  // connect, and each read or write
  std::string ca_file;       // https: CA bundle to verify the server with ("": system default)
  std::string bearer_token;  // sent as "Authorization: Bearer ..." when not empty
};

// One request to `url` (http://host[:port]/path?query or https://...).
// A transport failure is UNAVAILABLE naming the URL; any HTTP status is a
// response (the caller judges it).
absl::StatusOr<HttpResponse> HttpRequest(const std::string& method, const std::string& url,
                                         const std::string& body, const std::string& content_type,
                                         const HttpOptions& options);

// Percent-encodes `text` for a query string.
std::string UrlEncode(const std::string& text);

}  // namespace pdserve::planner
