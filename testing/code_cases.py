"""Per compiled language, the programs the code verifier's tests and benches grade: a correct
A+B, a wrong answer, an infinite loop, a 1 GiB allocation, a crash, a syntax error, an output
flood, a process spawn and, where the language reads files at compile time, a compile-time
file read; each with the error type it must get."""

from __future__ import annotations

# (case, expected error type, source) per language.
C_CASES = [
    ("ok", None, '#include <stdio.h>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}'),
    ("wrong", "wrong_answer", '#include <stdio.h>\nint main(){long long a,b;scanf("%lld %lld",&a,&b);'
     'printf("%lld\\n",a+b+1);}'),
    ("loop", "timeout", "int main(){volatile unsigned long x=0;for(;;)x++;}"),
    ("alloc", "memory_limit", "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
     "int main(){char*volatile p=malloc(1ul<<30);memset(p,1,1ul<<30);printf(\"%d\\n\",p[12345]);}"),
    ("crash", "runtime_error", "int main(){volatile int*p=0;*p=1;return 0;}"),
    ("syntax", "compile_error", "int main({"),
    ("flood", "output_limit", '#include <stdio.h>\nint main(){for(;;)puts("flooding the judge with lines");}'),
    ("fork", "runtime_error", '#include <stdio.h>\n#include <unistd.h>\nint main(){if(fork()<0)return 3;'
     'long long a,b;scanf("%lld %lld",&a,&b);printf("%lld\\n",a+b);}'),
    ("include_file", "compile_error", '#include "/etc/passwd"\nint main(){}'),
    ("include_random", "compile_error", "#include </dev/random>\nint main(){}"),
]  # fmt: skip
CPP_CASES = [
    ("ok", None, "#include <bits/stdc++.h>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"),
    ("wrong", "wrong_answer", "#include <iostream>\nint main(){long long a,b;std::cin>>a>>b;std::cout<<a-b<<'\\n';}"),
    ("loop", "timeout", "int main(){volatile unsigned long x=0;for(;;)x++;}"),
    ("alloc", "memory_limit", "#include <vector>\nint main(){std::vector<char> v(1u<<30,1);return v[5]==9;}"),
    # Asks for more than its memory limit, then runs out of time before it touches it (as on a
    # busy node, where touching it is slow): over memory, as a judge that bounds the address
    # space fails it at once (problemtools' run_time_error/memory_limit.cc).
    ("alloc_then_loop", "memory_limit", "int main(){char*volatile p=new char[1ul<<30];p[0]=1;for(;;);}"),
    ("crash", "runtime_error", "#include <cstdlib>\nint main(){std::abort();}"),
    ("syntax", "compile_error", "int main(){ return }"),
    ("flood", "output_limit", "#include <cstdio>\nint main(){for(;;)std::puts(\"flood\");}"),
    ("fork", "runtime_error", "#include <unistd.h>\n#include <iostream>\nint main(){if(fork()<0)return 3;"
     "long long a,b;std::cin>>a>>b;std::cout<<a+b<<'\\n';}"),
    ("include_file", "compile_error", '#include "/etc/passwd"\nint main(){}'),
    ("template_bomb", "compile_error", "template<int N>struct F{enum{v=F<N-1>::v+F<N-2>::v};};"
     "template<>struct F<0>{enum{v=0};};template<>struct F<1>{enum{v=1};};\n"
     "int main(){return F<100000>::v;}"),
    ("constexpr_bomb", "compile_error", "constexpr long long f(long long n){long long s=0;for(long long i=0;i<n;i++)"
     "s+=i%7;return s;}\nconstexpr long long x=f(1ll<<40);int main(){return x;}"),
    # Each evaluation stops at gcc's own limit of operations, after ~4 s of cc1plus's CPU (the
    # driver's child), and each constant gets its own: a minute of CPU, little memory.
    ("constexpr_cpu_bomb", "compile_error", "constexpr long long g(int k){long long s=0;for(int d=0;d<25;d++)"
     "for(int i=0;i<200000;i++)s+=(i^k)%7;return s;}\nconstexpr long long "
     + ",".join(f"x{k}=g({k})" for k in range(16)) + ";int main(){return x0;}"),
]  # fmt: skip
JAVA_CASES = [
    ("ok", None, "import java.util.*;\npublic class Main{public static void main(String[] a){"
     "Scanner s=new Scanner(System.in);long x=s.nextLong(),y=s.nextLong();System.out.println(x+y);}}"),
    ("not_main", None, "import java.io.*;\nimport java.util.*;\n"
     "class Helper{static long add(long a,long b){return a+b;}}\npublic class Solution{"
     "public static void main(String[] args)throws IOException{BufferedReader r=new BufferedReader("
     "new InputStreamReader(System.in));StringTokenizer t=new StringTokenizer(r.readLine());"
     "System.out.println(Helper.add(Long.parseLong(t.nextToken()),Long.parseLong(t.nextToken())));}}"),
    # A type declared inside the main class before main (ICPC Rocky Mountain 2022's profitabletrip_zf.java).
    ("nested_first", None, "import java.util.*;\npublic class Trip{\n"
     "  static class Edge{long v;Edge(long v){this.v=v;}}\n"
     "  public static void main(String[] a){Scanner s=new Scanner(System.in);\n"
     "    System.out.println(new Edge(s.nextLong()).v+new Edge(s.nextLong()).v);}\n}"),
    # Annotations, comments and modifiers before `class`, on its line or on lines of their own.
    ("annotated", None, "import java.util.*;\n@SuppressWarnings(\"unchecked\") public class Solution {\n"
     "  public static void main(String[] a){Scanner s=new Scanner(System.in);\n"
     "    System.out.println(s.nextLong()+s.nextLong());}\n}"),
    ("annotated_apart", None, "import java.util.*;\n/** Helpers. */ @Deprecated\npublic /* shared */\n"
     "final class Util { static long add(long a, long b){return a+b;} }\n"
     "class Runner { @SuppressWarnings({\"rawtypes\", \"unchecked\"}) public static void main(String[] a){\n"
     "    Scanner s=new Scanner(System.in);System.out.println(Util.add(s.nextLong(),s.nextLong()));}\n}"),
    ("wrong", "wrong_answer", "public class Main{public static void main(String[] a){System.out.println(42);}}"),
    ("loop", "timeout", "public class Main{public static void main(String[] a){long x=0;while(true){x++;}}}"),
    ("alloc", "memory_limit", "public class Main{public static void main(String[] a){byte[] b=new byte[1<<30];b[7]=1;"
     "System.out.println(b[7]);}}"),
    ("crash", "runtime_error", "public class Main{public static void main(String[] a){"
     "throw new IllegalStateException(\"x\");}}"),
    ("syntax", "compile_error", "public class Main{public static void main(String[] a){int x = ;}}"),
    ("flood", "output_limit", "public class Main{public static void main(String[] a){"
     "while(true)System.out.println(\"flood\");}}"),
    ("long_class_name", "compile_error", "public class " + "L" * 300 + "{public static void main(String[] a){"
     "System.out.println(3);}}"),  # no file may have its name: not a sandbox failure
    ("fork", "runtime_error", "public class Main{public static void main(String[] a)throws Exception{"
     "new ProcessBuilder(\"/bin/true\").start().waitFor();System.out.println(3);}}"),
]  # fmt: skip
GO_CASES = [
    ("ok", None, 'package main\nimport "fmt"\nfunc main(){var a,b int64\nfmt.Scan(&a,&b)\nfmt.Println(a+b)}'),
    ("wrong", "wrong_answer", 'package main\nimport "fmt"\nfunc main(){fmt.Println(7)}'),
    ("loop", "timeout", "package main\nfunc main(){x:=0\nfor {x++}}"),
    ("alloc", "memory_limit", 'package main\nimport "fmt"\nfunc main(){b:=make([]byte,1<<30)\n'
     'for i:=range b{b[i]=1}\nfmt.Println(b[5])}'),
    ("crash", "runtime_error", 'package main\nfunc main(){panic("no")}'),
    ("syntax", "compile_error", "package main\nfunc main(){ x := }"),
    ("flood", "output_limit", 'package main\nimport "fmt"\nfunc main(){for {fmt.Println("flood")}}'),
    ("fork", "runtime_error", 'package main\nimport ("fmt";"os";"os/exec")\n'
     'func main(){if err:=exec.Command("/bin/true").Run();err!=nil{os.Exit(3)}\nfmt.Println(3)}'),
]  # fmt: skip
RUST_CASES = [
    ("ok", None, "use std::io::*;\nfn main(){let mut s=String::new();stdin().read_to_string(&mut s).unwrap();"
     "let v:Vec<i64>=s.split_whitespace().map(|x|x.parse().unwrap()).collect();println!(\"{}\",v[0]+v[1]);}"),
    ("wrong", "wrong_answer", "fn main(){println!(\"0\");}"),
    ("loop", "timeout", "fn main(){let mut x:u64=0;loop{unsafe{std::ptr::write_volatile(&mut x,x+1);}}}"),
    ("alloc", "memory_limit", "fn main(){let v=vec![1u8;1<<30];println!(\"{}\",v[v.len()/2]);}"),
    ("crash", "runtime_error", "fn main(){let v:Vec<i32>=Vec::new();println!(\"{}\",v[std::env::args().count()+2]);}"),
    ("syntax", "compile_error", "fn main(){ let x = ; }"),
    ("flood", "output_limit", "fn main(){loop{println!(\"flood\");}}"),
    ("fork", "runtime_error", "fn main(){std::process::Command::new(\"/bin/true\").status().unwrap();"
     "println!(\"3\");}"),
    ("include_file", "compile_error", "const S:&str=include_str!(\"/etc/passwd\");fn main(){println!(\"{}\",S);}"),
]  # fmt: skip
JS_CASES = [
    ("ok", None, "const [a,b]=require('fs').readFileSync(0,'utf8').trim().split(/\\s+/).map(BigInt);"
     "console.log((a+b).toString());"),
    ("wrong", "wrong_answer", "console.log('nope');"),
    ("loop", "timeout", "let x=0;for(;;){x++;}"),
    ("alloc", "memory_limit", "const b=Buffer.alloc(1<<30,1);console.log(b[7]);"),
    ("crash", "runtime_error", "throw new Error('crash');"),
    ("syntax", "compile_error", "function f( {"),
    ("flood", "output_limit", "const s='flood\\n'.repeat(1000);for(;;){require('fs').writeSync(1,s);}"),
    ("fork", "runtime_error", "require('child_process').execSync('/bin/true');console.log(3);"),
]  # fmt: skip
# What models write for current toolchains: Go 1.21's min and max, Rust 1.65's let-else, C++20
# (ranges, <=>, concepts, map::contains) under a plain cpp tag.
CASES = {"c": C_CASES, "cpp": CPP_CASES, "java": JAVA_CASES, "go": GO_CASES, "rust": RUST_CASES, "javascript": JS_CASES}
TAGS = {"c": "c", "cpp": "cpp", "java": "java", "go": "go", "rust": "rust", "javascript": "js"}
