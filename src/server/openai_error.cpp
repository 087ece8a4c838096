#include "server/openai_error.h"

namespace markbase::server {

const char* error_type(int status) {
    return status < 500 ? "invalid_request_error" : "server_error";
}

nlohmann::json error_body(const ApiError& e) {
    nlohmann::json err;
    err["message"] = e.what();
    err["type"] = error_type(e.status);
    err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
    err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
    return {{"error", err}};
}

}  // namespace markbase::server
