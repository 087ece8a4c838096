// OpenAI's error responses: every failed request gets a status and {"error": {"message", "type", "param",
// "code"}}, the shape the official clients parse into their APIError.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace markbase::server {

// Thrown anywhere while a request is served; the HTTP layer turns it into the response.
struct ApiError : std::runtime_error {
    int status;
    std::string param;  // the request field at fault ("messages[2].content", "temperature"), or empty
    std::string
        code;  // OpenAI's machine-readable code ("invalid_api_key", "context_length_exceeded"), or empty
    ApiError(int status_, const std::string& message, std::string param_ = "", std::string code_ = "")
        : std::runtime_error(message), status(status_), param(std::move(param_)), code(std::move(code_)) {}
};

// "invalid_request_error" below 500, "server_error" from 500 (OpenAI's two types for these statuses).
const char* error_type(int status);

// {"error": {"message", "type", "param", "code"}}; param and code are null when empty.
nlohmann::json error_body(const ApiError& e);

}  // namespace markbase::server
