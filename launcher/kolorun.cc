// PLACEHOLDER: replaced by the real launcher.
int main() { return 1; }
