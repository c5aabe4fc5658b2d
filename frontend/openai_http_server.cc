#include "frontend/openai_http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "common/process_metrics.h"
#include "frontend/errors.h"
#include "frontend/openai_protocol.h"
#include "httplib.h"

namespace pdserve::frontend {
namespace {

using openai::Api;

// httplib's task queue with threads created on demand, up to a limit: the
// library's fixed pool would cap concurrent streams at its size, and a pool
// as large as the admission limit would start a thousand idle threads.
class GrowingThreadPool final : public httplib::TaskQueue {
 public:
  explicit GrowingThreadPool(size_t max_threads) : max_threads_(std::max<size_t>(max_threads, 1)) {}
  ~GrowingThreadPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
    if (idle_ < queue_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
  }

  void shutdown() override {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        ++idle_;
        mu_.Await(absl::Condition(this, &GrowingThreadPool::Ready));
        --idle_;
        if (queue_.empty()) return;  // stopping, nothing left
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  const size_t max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

void SetJson(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void SetError(httplib::Response& res, const absl::Status& status) {
  SetJson(res, openai::HttpStatus(status.code()), openai::ErrorBody(status));
  if (std::string after = RetryAfterSeconds(status); !after.empty()) {
    res.set_header("Retry-After", after);
  }
}

std::string Event(const std::string& payload) { return absl::StrCat("data: ", payload, "\n\n"); }

}  // namespace

OpenAiHttpServer::OpenAiHttpServer(OpenAiHttpOptions options, SessionManager* sessions)
    : options_(std::move(options)),
      sessions_(sessions),
      created_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    OpenAiHttpOptions options, SessionManager* sessions) {
  std::unique_ptr<OpenAiHttpServer> s(new OpenAiHttpServer(std::move(options), sessions));
  OpenAiHttpServer* self = s.get();
  s->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *s->server_;
  const size_t max_threads = static_cast<size_t>(std::max(1, s->options_.max_threads));
  server.new_task_queue = [max_threads] { return new GrowingThreadPool(max_threads); };
  server.set_payload_max_length(static_cast<size_t>(s->options_.max_body_bytes));
  server.set_keep_alive_timeout(2);  // idle connections hold a thread; shutdown waits for them

  server.Get("/health", [self](const httplib::Request&, httplib::Response& res) {
    if (self->sessions_->draining()) {
      SetJson(res, 503, R"({"status":"draining"})");
    } else {
      SetJson(res, 200, R"({"status":"ok"})");
    }
  });
  server.Get("/v1/models", [self](const httplib::Request&, httplib::Response& res) {
    SetJson(res, 200,
            openai::ModelsBody(self->options_.model_name,
                               self->sessions_->prompt_source().config.max_position_embeddings,
                               self->created_));
  });
  server.Post("/v1/completions", [self](const httplib::Request& req, httplib::Response& res) {
    self->Generate(/*chat=*/false, req, res);
  });
  server.Post("/v1/chat/completions", [self](const httplib::Request& req, httplib::Response& res) {
    self->Generate(/*chat=*/true, req, res);
  });
  // Called for every status >= 400; fills in only responses without a body
  // (no route: 404; body over the limit: 413; a malformed request).
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [self](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        absl::Status status;
        if (res.status == 404) {
          status = absl::NotFoundError(absl::StrCat("no route for ", req.method, " ", req.path));
        } else if (res.status == 413) {
          status = self->sessions_->Refuse(
              absl::InvalidArgumentError(absl::StrCat("request body larger than ",
                                                      self->options_.max_body_bytes, " bytes")),
              "invalid_argument");
        } else {
          status = absl::InvalidArgumentError(
              absl::StrCat("malformed HTTP request (HTTP ", res.status, ")"));
        }
        res.set_content(openai::ErrorBody(status), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SetError(res, absl::InternalError("internal error"));
      });
  // SO_REUSEADDR only: the library default adds SO_REUSEPORT, which would let
  // two servers share a port.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const std::string& host = s->options_.host;
  const int port = s->options_.port;
  s->port_ =
      port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("HTTP server cannot bind ", host, ":", port));
  }
  s->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // stop() before the accept loop runs would be lost: return once it runs.
  for (int i = 0; i < 5000 && !server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server.is_running()) return absl::InternalError("HTTP server did not start");
  return s;
}

OpenAiHttpServer::~OpenAiHttpServer() {
  stopping_.store(true);
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void OpenAiHttpServer::Generate(bool chat, const httplib::Request& req, httplib::Response& res) {
  const Api api = chat ? Api::kChat : Api::kCompletions;
  const CallInfo call{.arrival = absl::Now()};
  const PromptSource& source = sessions_->prompt_source();
  absl::StatusOr<openai::ParsedRequest> parsed = openai::ParseRequest(
      api, req.body,
      {.model_name = options_.model_name, .add_bos = source.tokenizer->add_bos_token()});
  if (!parsed.ok()) {
    SetError(res, sessions_->Refuse(parsed.status(), "invalid_argument"));
    return;
  }
  const std::string id = openai::NewResponseId(api);
  parsed->request.request_id = id;
  absl::StatusOr<std::unique_ptr<RequestSession>> started = sessions_->Start(parsed->request, call);
  if (!started.ok()) {
    SetError(res, started.status());
    return;
  }
  std::shared_ptr<RequestSession> session = *std::move(started);
  auto formatter = std::make_shared<openai::ResponseFormatter>(
      api, id, absl::ToUnixSeconds(call.arrival), options_.model_name, *source.tokenizer,
      parsed->include_usage, parsed->request.sampling.logprobs >= 0);
  const absl::Duration poll = options_.poll;

  // The status is decided by the first output, streamed or not: a request
  // that waited for room may still be refused (429 with Retry-After)
  // before a byte of the response is sent.
  std::optional<Delta> first;
  while (!first.has_value()) {
    if (stopping()) {
      SetError(res, session->Abandon());
      return;
    }
    absl::StatusOr<std::optional<Delta>> next = session->Next(poll);
    if (!next.ok()) {
      SetError(res, next.status());
      return;
    }
    first = *std::move(next);
  }

  if (parsed->stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [this, session, formatter, poll, first = std::move(first)](
                                 size_t, httplib::DataSink& sink) mutable {
          auto write = [&sink](const std::string& text) {
            return sink.write(text.data(), text.size());
          };
          if (first.has_value()) {
            for (const std::string& chunk : formatter->Chunks(*first)) {
              if (!write(Event(chunk))) return false;
            }
            const bool finished = first->finished;
            first.reset();
            if (finished) {
              if (!write(Event("[DONE]"))) return false;
              sink.done();
              return true;
            }
          }
          absl::Status status = RunSession(
              *session,
              [&](const Delta& delta) {
                if (stopping()) return false;
                for (const std::string& chunk : formatter->Chunks(delta)) {
                  if (!write(Event(chunk))) return false;
                }
                return true;
              },
              [&] { return stopping() || !sink.is_writable(); }, poll);
          if (status.code() == absl::StatusCode::kCancelled) return false;  // the client left
          if (!status.ok() && !write(Event(openai::ErrorBody(status)))) return false;
          if (!write(Event("[DONE]"))) return false;
          sink.done();
          return true;
        });
    return;
  }

  formatter->Add(*first);
  if (first->finished) {
    SetJson(res, 200, formatter->Body());
    return;
  }
  res.set_chunked_content_provider(
      "application/json", [this, session, formatter, poll](size_t, httplib::DataSink& sink) {
        // Nothing is written until the end: look at the connection every
        // `poll` even while tokens keep coming.
        absl::Time checked = absl::Now();
        auto gone = [&] {
          checked = absl::Now();
          return stopping() || !sink.is_writable();
        };
        absl::Status status = RunSession(
            *session,
            [&](const Delta& delta) {
              formatter->Add(delta);
              return absl::Now() - checked < poll || !gone();
            },
            gone, poll);
        if (!status.ok()) {
          if (status.code() != absl::StatusCode::kCancelled) {
            PDSERVE_LOG(WARNING) << "request " << session->request().request_id
                                 << " failed after its response began: " << status;
          }
          return false;  // the connection is closed without a complete body
        }
        const std::string body = formatter->Body();
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      });
}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> StartOpenAiHttpFromFlags(
    const std::string& host, int port, const std::string& model_name, const std::string& model_dir,
    int max_in_flight, SessionManager* sessions) {
  if (port < 0) return nullptr;
  return OpenAiHttpServer::Start(
      {.host = host,
       .port = port,
       .model_name = model_name.empty() ? ModelNameOf(model_dir) : model_name,
       .max_threads = std::max(max_in_flight, 0) + 64},
      sessions);
}

}  // namespace pdserve::frontend
