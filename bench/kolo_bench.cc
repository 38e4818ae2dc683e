// PLACEHOLDER: replaced by the real benchmark driver.
int main() { return 1; }
