#include "bench_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kolo/core/errors.h"

namespace kolo::bench {

void Report::add_row(std::vector<std::string> cells, nlohmann::json json) {
  rows.push_back(std::move(cells));
  json_rows.push_back(std::move(json));
}

std::string Report::text() const {
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].size();
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], row[c].size());
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      out << (c ? "  " : "") << std::string(width[c] - cell.size(), ' ') << cell;
    }
    out << "\n";
  };
  if (!title.empty()) out << title << "\n";
  line(columns);
  for (const auto& row : rows) line(row);
  for (const auto& note : notes) out << note << "\n";
  return out.str();
}

std::string Report::markdown() const {
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    out << "|";
    for (const auto& cell : cells) out << " " << cell << " |";
    out << "\n";
  };
  line(columns);
  out << "|";
  for (size_t c = 0; c < columns.size(); ++c) out << (c == 0 ? " --- |" : " ---: |");
  out << "\n";
  for (const auto& row : rows) line(row);
  if (!notes.empty()) {
    out << "\n";
    for (const auto& note : notes) out << "- " << note << "\n";
  }
  return out.str();
}

void write_docs_section(const std::string& path, const std::string& section,
                        const std::string& body) {
  const std::string begin = "<!-- kolo-bench:" + section + ":begin -->";
  const std::string end = "<!-- kolo-bench:" + section + ":end -->";
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  }
  const std::string block = begin + "\n" + body + end;
  const size_t b = text.find(begin);
  const size_t e = text.find(end);
  if (b != std::string::npos && e != std::string::npos && e > b) {
    text.replace(b, e + end.size() - b, block);
  } else {
    if (!text.empty() && text.back() != '\n') text += "\n";
    text += "\n" + block + "\n";
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) throw ContractError("kolo-bench: cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw ContractError("kolo-bench: cannot rename " + tmp + " to " + path);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    ++unit;
  }
  std::ostringstream out;
  out << (bytes == static_cast<long long>(bytes) ? static_cast<long long>(bytes) : bytes) << " "
      << units[unit];
  return out.str();
}

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

}  // namespace kolo::bench
