#include <tutti/tutti.h>

#include <iostream>

int main() {
  tutti::Tensor t = tutti::Tensor::zeros({2, 3}, tutti::DType::bf16);
  std::cout << "tutti " << tutti::version() << ": " << t.str() << "\n";
  return t.numel() == 6 ? 0 : 1;
}
