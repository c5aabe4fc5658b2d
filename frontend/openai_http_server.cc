#include "frontend/openai_http_server.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/http_server.h"
#include "common/process_metrics.h"
#include "frontend/choice_fanout.h"
#include "frontend/errors.h"
#include "frontend/openai_protocol.h"

namespace pdserve::frontend {
namespace {

using openai::Api;

constexpr const char* kJson = "application/json";

void SendError(http::ResponseWriter& out, const absl::Status& status) {
  http::Headers extra;
  if (std::string after = RetryAfterSeconds(status); !after.empty()) {
    extra.emplace_back("Retry-After", std::move(after));
  }
  out.Send(openai::HttpStatus(status.code()), kJson, openai::ErrorBody(status), extra);
}

std::string Event(const std::string& payload) { return absl::StrCat("data: ", payload, "\n\n"); }

}  // namespace

OpenAiHttpServer::OpenAiHttpServer(OpenAiHttpOptions options, SessionManager* sessions,
                                   ToolCallFormat tool_format)
    : options_(std::move(options)),
      sessions_(sessions),
      tool_format_(tool_format),
      created_(absl::ToUnixSeconds(absl::Now())) {}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> OpenAiHttpServer::Start(
    OpenAiHttpOptions options, SessionManager* sessions) {
  const PromptSource& source = sessions->prompt_source();
  absl::StatusOr<ToolCallFormat> tool_format = ToolCallFormatFor(
      options.tool_call_parser, source.chat_template ? source.chat_template->source : "");
  if (!tool_format.ok()) return tool_format.status();
  std::unique_ptr<OpenAiHttpServer> s(
      new OpenAiHttpServer(std::move(options), sessions, *tool_format));
  OpenAiHttpServer* self = s.get();
  const OpenAiHttpOptions& o = s->options_;
  // Errors the server answers on its own, while reading a request.
  auto error_body = [self](int status, absl::string_view message) {
    absl::Status error;
    if (status == 413) {
      error = self->sessions_->Refuse(absl::InvalidArgumentError(message), "invalid_argument");
    } else if (status == 503) {
      error = absl::UnavailableError(absl::StrCat("HTTP server: ", message));
    } else {
      error = absl::InvalidArgumentError(
          absl::StrCat("malformed HTTP request (HTTP ", status, "): ", message));
    }
    return http::ErrorResponse{kJson, openai::ErrorBody(error)};
  };
  absl::StatusOr<std::unique_ptr<http::Server>> server = http::Server::Start(
      {.host = o.host,
       .port = o.port,
       .name = "OpenAI HTTP server",
       .max_connections = std::max(1, o.max_connections),
       .max_handler_threads = std::max(1, o.max_threads),
       .header_timeout = o.header_timeout,
       .body_timeout = o.body_timeout,
       .idle_timeout = o.idle_timeout,
       .max_body_bytes = o.max_body_bytes},
      [self](const http::Request& req, http::ResponseWriter& out) { self->Handle(req, out); },
      error_body);
  if (!server.ok()) {
    return absl::UnavailableError(absl::StrCat("HTTP server cannot bind ", o.host, ":", o.port,
                                               ": ", server.status().message()));
  }
  s->server_ = *std::move(server);
  return s;
}

OpenAiHttpServer::~OpenAiHttpServer() {
  stopping_.store(true);
  server_.reset();
}

int OpenAiHttpServer::port() const { return server_->port(); }

void OpenAiHttpServer::Handle(const http::Request& req, http::ResponseWriter& out) {
  const std::string& method = req.head.method;
  const std::string& path = req.head.path;
  if (method == "GET" && path == "/health") {
    if (sessions_->draining()) {
      out.Send(503, kJson, R"({"status":"draining"})");
    } else {
      out.Send(200, kJson, R"({"status":"ok"})");
    }
  } else if (method == "GET" && path == "/v1/models") {
    out.Send(
        200, kJson,
        openai::ModelsBody(options_.model_name,
                           sessions_->prompt_source().config.max_position_embeddings, created_));
  } else if (method == "POST" && path == "/v1/completions") {
    Generate(/*chat=*/false, req, out);
  } else if (method == "POST" && path == "/v1/chat/completions") {
    Generate(/*chat=*/true, req, out);
  } else {
    SendError(out, absl::NotFoundError(absl::StrCat("no route for ", method.substr(0, 16), " ",
                                                    path.substr(0, 256))));
  }
}

void OpenAiHttpServer::Generate(bool chat, const http::Request& req, http::ResponseWriter& out) {
  const Api api = chat ? Api::kChat : Api::kCompletions;
  const CallInfo call{.arrival = absl::Now()};
  const PromptSource& source = sessions_->prompt_source();
  absl::StatusOr<openai::ParsedRequest> parsed =
      openai::ParseRequest(api, req.body,
                           {.model_name = options_.model_name,
                            .add_bos = source.tokenizer->add_bos_token(),
                            .tool_format = tool_format_,
                            .max_n = options_.max_n});
  if (!parsed.ok()) {
    SendError(out, sessions_->Refuse(parsed.status(), "invalid_argument"));
    return;
  }
  if (parsed->n > 1) {
    GenerateChoices(*parsed, call, out);
    return;
  }
  const std::string id = openai::NewResponseId(api);
  parsed->request.request_id = id;
  absl::StatusOr<std::unique_ptr<RequestSession>> started = sessions_->Start(parsed->request, call);
  if (!started.ok()) {
    SendError(out, started.status());
    return;
  }
  std::unique_ptr<RequestSession> session = *std::move(started);
  openai::ResponseFormatter formatter(api, id, absl::ToUnixSeconds(call.arrival),
                                      options_.model_name, *source.tokenizer, parsed->include_usage,
                                      parsed->request.sampling.logprobs >= 0, parsed->tool_format);
  const absl::Duration poll = options_.poll;
  auto gone = [&] { return stopping() || out.ClientGone(); };

  // The status is decided by the first output, streamed or not: a request
  // that waited for room may still be refused (429 with Retry-After)
  // before a byte of the response is sent.
  std::optional<Delta> first;
  while (!first.has_value()) {
    if (gone()) {
      const absl::Status why = session->Abandon();
      if (stopping()) SendError(out, why);
      return;
    }
    absl::StatusOr<std::optional<Delta>> next = session->Next(poll);
    if (!next.ok()) {
      SendError(out, next.status());
      return;
    }
    first = *std::move(next);
  }

  if (parsed->stream) {
    if (!out.Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) {
      session->Abandon().IgnoreError();  // the client left
      return;
    }
    auto relay = [&](const Delta& delta) {
      if (stopping()) return false;
      for (const std::string& chunk : formatter.Chunks(delta)) {
        if (!out.Write(Event(chunk))) return false;
      }
      return true;
    };
    if (!relay(*first)) {
      session->Abandon().IgnoreError();
      return;
    }
    absl::Status status =
        first->finished ? absl::OkStatus() : RunSession(*session, relay, gone, poll);
    if (status.code() == absl::StatusCode::kCancelled) return;  // the client left
    if (!status.ok() && !out.Write(Event(openai::ErrorBody(status)))) return;
    if (out.Write(Event("[DONE]"))) out.End();
    return;
  }

  formatter.Add(*first);
  if (first->finished) {
    out.Send(200, kJson, formatter.Body());
    return;
  }
  // The head goes out now; the body once complete. Nothing is written until
  // the end: look at the connection at most every kTokenCheck while tokens
  // keep coming (a cost per token), and every `poll` while none is due.
  if (!out.Begin(200, kJson)) {
    session->Abandon().IgnoreError();
    return;
  }
  constexpr absl::Duration kTokenCheck = absl::Milliseconds(20);
  absl::Time checked = absl::Now();
  auto gone_now = [&] {
    checked = absl::Now();
    return gone();
  };
  absl::Status status = RunSession(
      *session,
      [&](const Delta& delta) {
        formatter.Add(delta);
        return absl::Now() - checked < kTokenCheck || !gone_now();
      },
      gone_now, poll);
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kCancelled) {
      PDSERVE_LOG(WARNING) << "request " << session->request().request_id
                           << " failed after its response began: " << status;
    }
    return;  // the connection is closed without a complete body
  }
  if (out.Write(formatter.Body())) out.End();
}

void OpenAiHttpServer::GenerateChoices(const openai::ParsedRequest& parsed, const CallInfo& call,
                                       http::ResponseWriter& out) {
  const int n = parsed.n;
  // n choices are n sequences of load: admitted all together or refused.
  // (Each choice's session then takes its slot; one refused in a race with
  // other requests fails this request before its status is sent.)
  const int max_in_flight = sessions_->options().max_in_flight;
  if (sessions_->in_flight() + n > max_in_flight) {
    SendError(out,
              sessions_->Refuse(absl::ResourceExhaustedError(absl::StrCat(
                                    sessions_->options().server_kind, " at capacity: ", n,
                                    " choices do not fit in ", max_in_flight,
                                    " sequences in flight (", sessions_->in_flight(), " now)")),
                                "capacity"));
    return;
  }
  const std::string id = openai::NewResponseId(parsed.api);
  const absl::Duration poll = options_.poll;
  auto gone = [&] { return stopping() || out.ClientGone(); };
  absl::StatusOr<std::unique_ptr<ChoiceFanout>> started =
      ChoiceFanout::Start(*sessions_, ChoiceRequests(parsed.request, id, n), call, gone, poll);
  if (!started.ok()) {
    if (started.status().code() != absl::StatusCode::kCancelled || stopping()) {
      SendError(out, started.status());
    }
    return;
  }
  ChoiceFanout& fanout = **started;
  const text::Tokenizer& tokenizer = *sessions_->prompt_source().tokenizer;
  std::vector<std::unique_ptr<openai::ResponseFormatter>> formatters;
  for (int i = 0; i < n; ++i) {
    formatters.push_back(std::make_unique<openai::ResponseFormatter>(
        parsed.api, id, absl::ToUnixSeconds(call.arrival), options_.model_name, tokenizer,
        parsed.include_usage, parsed.request.sampling.logprobs >= 0, parsed.tool_format, i));
  }

  // The status is decided once every choice has produced its first output
  // (a choice refused or failed before is the response's error); a
  // non-streamed response, once all have finished.
  std::vector<Delta> held;  // streamed: outputs before the status
  std::vector<int> held_index;
  std::vector<bool> begun(n, false);
  int num_begun = 0, num_finished = 0, prompt_tokens = 0, completion_tokens = 0;
  absl::Status failure;
  auto take = [&](ChoiceFanout::Output& o) {
    if (!o.delta.ok()) {
      failure = o.delta.status();
      fanout.Stop();
      return;
    }
    if (!begun[o.index]) {
      begun[o.index] = true;
      ++num_begun;
    }
    if (o.delta->finished) {
      ++num_finished;
      prompt_tokens = o.delta->prompt_tokens;
      completion_tokens += o.delta->completion_tokens;
    }
  };
  // The connection is looked at every `poll`, also while outputs keep coming.
  absl::Time checked = absl::InfinitePast();
  while (num_begun < n || (!parsed.stream && num_finished < n)) {
    if (absl::Now() - checked >= poll) {
      checked = absl::Now();
      if (gone()) {
        fanout.Stop();
        if (stopping()) SendError(out, absl::CancelledError("cancelled: the server is stopping"));
        return;
      }
    }
    std::optional<ChoiceFanout::Output> o = fanout.Next(poll);
    if (!o.has_value()) continue;
    take(*o);
    if (!failure.ok()) {
      SendError(out, failure);
      return;
    }
    if (parsed.stream) {
      held.push_back(*std::move(o->delta));
      held_index.push_back(o->index);
    } else {
      formatters[o->index]->Add(*o->delta);
    }
  }

  if (!parsed.stream) {
    std::vector<const openai::ResponseFormatter*> all;
    for (const auto& f : formatters) all.push_back(f.get());
    out.Send(200, kJson, openai::ResponseFormatter::Body(all));
    return;
  }
  if (!out.Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) {
    return;  // the client left; the fan-out ends every choice
  }
  auto relay = [&](int index, const Delta& delta) {
    if (stopping()) return false;
    for (const std::string& chunk : formatters[index]->Chunks(delta)) {
      if (!out.Write(Event(chunk))) return false;
    }
    return true;
  };
  for (size_t i = 0; i < held.size(); ++i) {
    if (!relay(held_index[i], held[i])) return;
  }
  while (num_finished < n) {
    std::optional<ChoiceFanout::Output> o = fanout.Next(poll);
    if (!o.has_value()) {
      if (gone()) return;
      continue;
    }
    take(*o);
    if (!failure.ok()) break;
    if (!relay(o->index, *o->delta)) return;
  }
  if (!failure.ok()) {
    if (failure.code() == absl::StatusCode::kCancelled) return;
    if (!out.Write(Event(openai::ErrorBody(failure)))) return;
  } else if (parsed.include_usage &&
             !out.Write(Event(formatters[0]->UsageChunk(prompt_tokens, completion_tokens)))) {
    return;
  }
  if (out.Write(Event("[DONE]"))) out.End();
}

absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> StartOpenAiHttpFromFlags(
    const std::string& host, int port, const std::string& model_name, const std::string& model_dir,
    int max_in_flight, SessionManager* sessions, const std::string& tool_call_parser, int max_n) {
  if (port < 0) return nullptr;
  return OpenAiHttpServer::Start(
      {.host = host,
       .port = port,
       .model_name = model_name.empty() ? ModelNameOf(model_dir) : model_name,
       .max_threads = std::max(max_in_flight, 0) + 64,
       .max_connections = std::max(max_in_flight, 0) + 1024,
       .tool_call_parser = tool_call_parser,
       .max_n = max_n},
      sessions);
}

}  // namespace pdserve::frontend
