#include "planner/http_client.h"

// Debian's cpp-httplib is a compiled library built with TLS (its pkg-config
// flags define CPPHTTPLIB_OPENSSL_SUPPORT for every user), so https works
// here as for every other user of it in the project.
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "httplib.h"

namespace pdserve::planner {

namespace http = ::httplib;

absl::StatusOr<HttpResponse> HttpRequest(const std::string& method, const std::string& url,
                                         const std::string& body, const std::string& content_type,
                                         const HttpOptions& options) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("not a URL: ", url));
  }
  const size_t path_start = url.find('/', scheme_end + 3);
  const std::string origin = path_start == std::string::npos ? url : url.substr(0, path_start);
  const std::string path = path_start == std::string::npos ? "/" : url.substr(path_start);
  const std::string scheme = url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported scheme in ", url));
  }
  http::Client client(origin);
  if (!client.is_valid()) return absl::InvalidArgumentError(absl::StrCat("bad URL: ", url));
  const int64_t us = absl::ToInt64Microseconds(options.timeout);
  client.set_connection_timeout(us / 1000000, us % 1000000);
  client.set_read_timeout(us / 1000000, us % 1000000);
  client.set_write_timeout(us / 1000000, us % 1000000);
  if (scheme == "https") {
    client.enable_server_certificate_verification(true);
    if (!options.ca_file.empty()) client.set_ca_cert_path(options.ca_file.c_str());
  }
  http::Headers headers;
  if (!options.bearer_token.empty()) {
    headers.emplace("Authorization", absl::StrCat("Bearer ", options.bearer_token));
  }
  headers.emplace("Accept", "application/json, text/plain;q=0.9, */*;q=0.5");
  if (method != "GET" && method != "PATCH" && method != "PUT" && method != "POST") {
    return absl::InvalidArgumentError(absl::StrCat("unsupported method ", method));
  }
  http::Result result = method == "GET"     ? client.Get(path, headers)
                        : method == "PATCH" ? client.Patch(path, headers, body, content_type)
                        : method == "PUT"   ? client.Put(path, headers, body, content_type)
                                            : client.Post(path, headers, body, content_type);
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat(method, " ", url, " failed: ", http::to_string(result.error())));
  }
  return HttpResponse{.status = result->status, .body = result->body};
}

std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

}  // namespace pdserve::planner
