// Config: typed parsing, malformed values as ContractError naming the variable
// and the accepted form, unknown-variable warnings, and docs/env_vars.md being
// current.
#include "kolo/core/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "kolo/core/errors.h"
#include "log.h"

namespace kolo {
namespace {

Config load(std::map<std::string, std::string> values) {
  return Config::load(map_env(std::move(values)));
}

// The ContractError message of loading `values`, or "" when it loads.
std::string load_error(std::map<std::string, std::string> values) {
  try {
    load(std::move(values));
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsWhenNothingIsSet) {
  Config config = load({});
  EXPECT_EQ(config.get_string("KOLO_BACKEND"), "auto");
  EXPECT_DOUBLE_EQ(config.get_double("KOLO_TIMEOUT_SECONDS"), 300.0);
  EXPECT_TRUE(config.get_bool("KOLO_CHECK_ARGS"));
  EXPECT_EQ(config.get_int("KOLO_SHM_SPIN_US"), 50);
  EXPECT_EQ(config.get_string("KOLO_LOG_LEVEL"), "warning");
  EXPECT_FALSE(config.is_set("KOLO_BACKEND"));
  EXPECT_FALSE(config.is_set("KOLO_RANK"));
  EXPECT_EQ(config.get_string("KOLO_STORE_ADDR"), "");
  // An int without default and not set: asking for it is a caller mistake.
  EXPECT_THROW(config.get_int("KOLO_RANK"), ContractError);
}

TEST(Config, ParsesEveryType) {
  Config config = load({{"KOLO_RANK", "3"},
                        {"KOLO_TIMEOUT_SECONDS", "2.5"},
                        {"KOLO_CHECK_ARGS", "off"},
                        {"KOLO_BACKEND", "GLOO"},
                        {"KOLO_STORE_ADDR", "10.0.0.1"},
                        {"KOLO_SHM_SPIN_US", "-0"}});
  EXPECT_EQ(config.get_int("KOLO_RANK"), 3);
  EXPECT_TRUE(config.is_set("KOLO_RANK"));
  EXPECT_DOUBLE_EQ(config.get_double("KOLO_TIMEOUT_SECONDS"), 2.5);
  EXPECT_FALSE(config.get_bool("KOLO_CHECK_ARGS"));
  EXPECT_EQ(config.get_string("KOLO_BACKEND"), "gloo");  // any case, listed spelling
  EXPECT_EQ(config.get_string("KOLO_STORE_ADDR"), "10.0.0.1");
  EXPECT_EQ(config.get_int("KOLO_SHM_SPIN_US"), 0);
}

TEST(Config, BooleansAcceptTheUsualSpellings) {
  for (const char* yes : {"1", "true", "TRUE", "Yes", "on", "ON"}) {
    EXPECT_TRUE(load({{"KOLO_CHECK_ARGS", yes}}).get_bool("KOLO_CHECK_ARGS")) << yes;
  }
  for (const char* no : {"0", "false", "False", "no", "NO", "off"}) {
    EXPECT_FALSE(load({{"KOLO_CHECK_ARGS", no}}).get_bool("KOLO_CHECK_ARGS")) << no;
  }
  std::string message = load_error({{"KOLO_CHECK_ARGS", "maybe"}});
  EXPECT_NE(message.find("KOLO_CHECK_ARGS=\"maybe\" is not a boolean"), std::string::npos)
      << message;
  EXPECT_NE(message.find("1/0, true/false, yes/no, on/off"), std::string::npos) << message;
}

TEST(Config, EmptyValueCountsAsUnset) {
  Config config = load({{"KOLO_TIMEOUT_SECONDS", ""}, {"KOLO_RANK", ""}});
  EXPECT_FALSE(config.is_set("KOLO_TIMEOUT_SECONDS"));
  EXPECT_DOUBLE_EQ(config.get_double("KOLO_TIMEOUT_SECONDS"), 300.0);
  EXPECT_FALSE(config.is_set("KOLO_RANK"));
}

TEST(Config, MalformedNumberNamesVariableValueAndForm) {
  EXPECT_EQ(load_error({{"KOLO_TIMEOUT_SECONDS", "abc"}}),
            "kolo config: KOLO_TIMEOUT_SECONDS=\"abc\" is not a number; expected a number of "
            "seconds >= 0.001, <= 1000000000, e.g. KOLO_TIMEOUT_SECONDS=300");
  // Whole-string parsing: trailing text, spaces, units and non-finite values fail.
  for (const char* bad : {"60s", " 60", "60 ", "", "nan", "inf", "1e999"}) {
    if (std::string(bad).empty()) continue;  // empty = unset, checked above
    EXPECT_NE(load_error({{"KOLO_TIMEOUT_SECONDS", bad}}), "") << bad;
  }
  for (const char* bad : {"1.5", "12abc", "0x10", " 3", "99999999999999999999"}) {
    std::string message = load_error({{"KOLO_SHM_SPIN_US", bad}});
    EXPECT_NE(message.find("KOLO_SHM_SPIN_US=\"" + std::string(bad) + "\""), std::string::npos)
        << message;
    EXPECT_NE(message.find("a whole number of microseconds >= 0"), std::string::npos) << message;
  }
}

TEST(Config, RangesFromTheDocAreEnforced) {
  std::string message = load_error({{"KOLO_TIMEOUT_SECONDS", "0"}});
  EXPECT_NE(message.find("KOLO_TIMEOUT_SECONDS=\"0\" is out of range"), std::string::npos)
      << message;
  EXPECT_NE(load_error({{"KOLO_TIMEOUT_SECONDS", "-5"}}), "");
  EXPECT_NE(load_error({{"KOLO_SHM_SPIN_US", "-1"}}), "");
  EXPECT_EQ(load_error({{"KOLO_SHM_SPIN_US", "0"}}), "");
  EXPECT_EQ(load_error({{"KOLO_TIMEOUT_SECONDS", "0.001"}}), "");
}

// Values beyond what the reader converts them to are errors, not wrapped
// numbers: KOLO_CACHE_CAPACITY=9223372036854775807 fit the registry's int64
// but became -1 as the engine's int (accepted before the upper bounds).
TEST(Config, ValuesThatOverflowTheirTargetTypeAreErrors) {
  const std::string message = load_error({{"KOLO_CACHE_CAPACITY", "9223372036854775807"}});
  EXPECT_NE(message.find("KOLO_CACHE_CAPACITY=\"9223372036854775807\" is out of range; expected "
                         "a whole number >= 0, <= 1048576"),
            std::string::npos)
      << message;
  EXPECT_NE(load_error({{"KOLO_RANK", "2147483648"}}), "");
  EXPECT_EQ(load_error({{"KOLO_RANK", "2147483647"}}), "");
  EXPECT_NE(load_error({{"KOLO_STORE_PORT", "70000"}}), "");
  EXPECT_NE(load_error({{"KOLO_SHM_SPIN_US", "9999999999"}}), "");
  // Seconds become milliseconds (int64) and clock durations: bounded too.
  EXPECT_NE(load_error({{"KOLO_TIMEOUT_SECONDS", "1e300"}}), "");
  EXPECT_NE(load_error({{"KOLO_STALL_SHUTDOWN_SECONDS", "1e300"}}), "");
  // Below a millisecond a timeout would round to 0 ms.
  EXPECT_NE(load_error({{"KOLO_TIMEOUT_SECONDS", "0.0001"}}).find("is out of range"),
            std::string::npos);
  EXPECT_NE(load_error({{"KOLO_CACHE_CAPACITY", "99999999999999999999"}}).find("is too large"),
            std::string::npos);
}

TEST(Config, ChoiceMustBeListed) {
  EXPECT_EQ(load_error({{"KOLO_BACKEND", "nccl"}}),
            "kolo config: KOLO_BACKEND=\"nccl\" is not a valid choice; expected one of auto, "
            "shm, gloo, mpi, e.g. KOLO_BACKEND=auto");
  EXPECT_NE(load_error({{"KOLO_LOG_LEVEL", "verbose"}}).find("error, warning, info, debug"),
            std::string::npos);
}

TEST(Config, GettersCheckNameAndType) {
  Config config = load({});
  EXPECT_THROW(config.get_int("KOLO_NO_SUCH_THING"), ContractError);
  EXPECT_THROW(config.get_bool("KOLO_BACKEND"), ContractError);
  EXPECT_THROW(config.get_int("KOLO_TIMEOUT_SECONDS"), ContractError);
  EXPECT_THROW(config.get_string("KOLO_RANK"), ContractError);
  EXPECT_THROW(config.is_set("NOT_KOLO"), ContractError);
}

TEST(Config, UnknownKoloVariableWarnsWithNearestName) {
  testing::internal::CaptureStderr();
  Config config = load({{"KOLO_TIMEOUT_SECOND", "5"}, {"KOLO_BAKEND", "shm"}, {"PATH", "/bin"}});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("kolo warning: unknown variable KOLO_TIMEOUT_SECOND is ignored; did you "
                     "mean KOLO_TIMEOUT_SECONDS?"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("KOLO_BAKEND is ignored; did you mean KOLO_BACKEND?"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("PATH"), std::string::npos) << err;
  // A warning, not a setting: the defaults stay.
  EXPECT_DOUBLE_EQ(config.get_double("KOLO_TIMEOUT_SECONDS"), 300.0);

  testing::internal::CaptureStderr();
  load({{"KOLO_ZZZZZZZZZZZZZZZZZZ", "1"}});
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("the closest known name is"), std::string::npos) << err;

  // KOLO_LOG_LEVEL=error silences warnings.
  testing::internal::CaptureStderr();
  load({{"KOLO_TIMEOUT_SECOND", "5"}, {"KOLO_LOG_LEVEL", "error"}});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(Config, ProcessEnvironmentIsRead) {
  setenv("KOLO_SHM_SPIN_US", "7", 1);
  Config config = Config::load(process_env());
  unsetenv("KOLO_SHM_SPIN_US");
  EXPECT_EQ(config.get_int("KOLO_SHM_SPIN_US"), 7);
  EXPECT_EQ(process_env()("KOLO_SHM_SPIN_US"), std::nullopt);
  // A null lookup means the process environment.
  EXPECT_EQ(Config::load(nullptr).get_string("KOLO_BACKEND"), "auto");
}

TEST(Config, EveryRegistryDefaultIsValid) {
  // load() validates defaults too; the registry must not ship a malformed one.
  EXPECT_NO_THROW(load({}));
  for (const auto& var : config_registry()) {
    EXPECT_EQ(std::string(var.name).rfind("KOLO_", 0), 0u) << var.name;
    EXPECT_NE(std::string(var.doc), "") << var.name;
  }
}

TEST(Logger, PrefixAndLevels) {
  detail::Logger logger(detail::LogLevel::kInfo, 3);
  testing::internal::CaptureStderr();
  logger.warning("disk on fire");
  logger.info("hello");
  logger.debug("not shown");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "kolo[rank 3] warning: disk on fire\nkolo[rank 3] info: hello\n");
  EXPECT_EQ(detail::Logger::from_config(load({{"KOLO_LOG_LEVEL", "debug"}}))
                .enabled(detail::LogLevel::kDebug),
            true);
}

TEST(EnvVarsDoc, MatchesTheRegistry) {
  const std::string expected = Config::markdown();
  const std::string generated = std::string(KOLO_BINARY_DIR) + "/env_vars.md";
  std::ofstream(generated) << expected;
  std::ifstream in(std::string(KOLO_SOURCE_DIR) + "/docs/env_vars.md");
  std::stringstream actual;
  actual << in.rdbuf();
  EXPECT_EQ(actual.str(), expected)
      << "docs/env_vars.md is out of date with core/src/config_registry.cc. Regenerate it with:\n"
      << "  cp " << generated << " " << KOLO_SOURCE_DIR << "/docs/env_vars.md";
}

}  // namespace
}  // namespace kolo
