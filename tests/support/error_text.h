// What the error-path tests share: the message a call fails with, and a check that it names everything a
// user needs (the file, the field or tensor, what was expected and found).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "model/error.h"

namespace markbase::testing {

// The message of the markbase::Error `f` throws, or "(no error)" when it returns. Any other exception is a
// test failure (an error path must end in a markbase::Error) and its message comes back marked.
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "not a markbase::Error: " << e.what();
        return std::string("(not a markbase::Error) ") + e.what();
    }
    return "(no error)";
}

// Every needle appears in msg.
inline void expect_has(const std::string& msg, const std::vector<std::string>& needles) {
    for (const auto& n : needles)
        EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
}

}  // namespace markbase::testing
