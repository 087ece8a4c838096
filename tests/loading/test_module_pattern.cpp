// compressed-tensors' targets and ignore entries (loading/module_pattern.h): Python's re.match semantics
// (anchored at the start, not at the end) over the subset of syntax the matcher takes, and a clear refusal of
// the rest.
#include <gtest/gtest.h>

#include <string>

#include "loading/module_pattern.h"
#include "support/error_text.h"

namespace markbase {
namespace {

using testing::error_of;
using testing::expect_has;

bool match(const std::string& entry, const std::string& module) {
    return ModulePattern::parse(entry, "config.json", "quantization_config.ignore[0]").matches(module);
}

TEST(ModulePattern, NamesClassesAndPatternsMatchAsCompressedTensorsDoes) {
    const std::string router = "model.language_model.layers.3.router.proj";
    EXPECT_TRUE(match("Linear", router));
    EXPECT_TRUE(match(router, router));
    EXPECT_FALSE(match("router.proj", router)) << "a plain entry is a full module name";
    EXPECT_TRUE(match("re:.*router.*", router));
    EXPECT_TRUE(match("re:.*router", router)) << "re.match does not anchor the end";
    EXPECT_FALSE(match("re:router", router)) << "re.match anchors the start";
    EXPECT_FALSE(match("re:.*router$", router));
    EXPECT_TRUE(match("re:.*proj$", router));
    EXPECT_TRUE(match("re:model\\.language_model\\.layers\\.\\d+\\.router\\.proj", router));
    EXPECT_FALSE(match("re:model\\.language_model\\.layers\\.\\d\\d\\.router", router));
    EXPECT_TRUE(match("re:.*layers\\.[0-3]\\.", router));
    EXPECT_FALSE(match("re:.*layers\\.[^0-3]\\.", router));
    EXPECT_TRUE(match("re:.*(vision|router|audio).*", router));
    EXPECT_TRUE(match("re:(?:.*)\\.(router|mlp)\\.proj", router));
    EXPECT_TRUE(match("re:^model\\.(language_model\\.)?layers", router));
    EXPECT_TRUE(match("re:model\\.layers|.*router", router));
    EXPECT_TRUE(match("re:m(o|d|e|l){4}\\.", router));
    EXPECT_FALSE(match("re:m(o|d|e|l){5}\\.", router));
    EXPECT_TRUE(match("re:[a-z_.]{1,}layers\\.3\\.r?outer", router));
    EXPECT_TRUE(match("re:.*\\.router\\.proj\\Z", router));
    EXPECT_TRUE(match("re:\\w+\\.\\w+\\.layers\\.\\d+\\.\\S+", router));
    EXPECT_TRUE(match("re:model.{2}", router) && match("re:.*?router", router));
    EXPECT_TRUE(match("re:x{,2}model", router)) << "{,n}: zero to n";
    EXPECT_TRUE(match("re:a{,}", "a{,}")) << "'{,}' is no quantifier: literal";
}

TEST(ModulePattern, UnsupportedOrBrokenPatternsAreRefusedNamingTheField) {
    for (const auto& [entry, why] : std::vector<std::pair<std::string, std::string>>{
             {"re:(abc", "'(' without its ')'"},
             {"re:abc)", "')' without its '('"},
             {"re:[abc", "'[' without its ']'"},
             {"re:*abc", "nothing to repeat"},
             {"re:a**", "repeats a repetition"},
             {"re:(?=abc)", "'(?' construct"},
             {"re:\\bproj", "escape '\\b'"},
             {"re:(a)\\1", "escape '\\1'"},
             {"re:a{3,1}", "n < m"},
             {"re:[z-a]", "runs backwards"},
             {"", "is empty"},
         }) {
        expect_has(error_of([&] { match(entry, "model.layers.0.mlp"); }),
                   {"config.json", "quantization_config.ignore[0]", why});
    }
    expect_has(error_of([] { match("re:" + std::string(2000, 'a'), "x"); }), {"2000 bytes", "at most 1000"});
    expect_has(error_of([] { match("re:" + std::string(40, '(') + std::string(40, ')'), "x"); }),
               {"more than 32 deep"});
}

TEST(ModulePattern, CatastrophicBacktrackingIsBoundedNotSlow) {
    const std::string name(64, 'a');
    expect_has(error_of([&] { match("re:(a|aa)*(a|aa)*(a|aa)*b", name); }),
               {"too much work", "quantization_config.ignore[0]"});
    EXPECT_FALSE(match("re:(a*)*b", std::string(8, 'a'))) << "empty repetitions end the loop";
    expect_has(error_of([] { match("re:((){1000}){1000}x", "y"); }), {"nests more than 2000 repetitions"});
    EXPECT_TRUE(match("re:(a?){150}b", std::string(150, 'a') + "b")) << "deep but legitimate";
}

}  // namespace
}  // namespace markbase
