// Result rows of kolo-bench: a printed table, JSON lines, and the section of
// docs/benchmarks.md that a mode owns. Shared by every benchmark mode.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kolo::bench {

// One table: column titles, then rows of already-formatted cells. Each row
// also carries its JSON object (the machine-readable form of the same row).
struct Report {
  std::string title;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::vector<nlohmann::json> json_rows;
  std::vector<std::string> notes;  // printed under the table (ratios, conditions)

  void add_row(std::vector<std::string> cells, nlohmann::json json);
  // Fixed-width text table for the terminal.
  std::string text() const;
  // GitHub markdown table.
  std::string markdown() const;
};

// Replaces the text between `<!-- kolo-bench:SECTION:begin -->` and
// `<!-- kolo-bench:SECTION:end -->` in the markdown file at `path` (appending
// the section when absent) with `body`. Throws ContractError when the file
// cannot be written.
void write_docs_section(const std::string& path, const std::string& section,
                        const std::string& body);

// "4 B", "64 KiB", "256 MiB".
std::string format_bytes(double bytes);
// Fixed decimals.
std::string format_fixed(double value, int decimals);

}  // namespace kolo::bench
