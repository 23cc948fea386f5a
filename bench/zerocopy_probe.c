/* zc: 64 KiB (or -s) messages over loopback TCP, sender with or without
 * MSG_ZEROCOPY (completions reaped from the error queue); prints msg/s and
 * the sender's CPU per message. Usage: zc SIZE SECONDS 0|1 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double cpu(void){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_utime.tv_usec*1e-6+r.ru_stime.tv_sec+r.ru_stime.tv_usec*1e-6;}
static long reap(int s){ char c[256]; long n=0; for(;;){ struct msghdr m={0}; m.msg_control=c; m.msg_controllen=sizeof c;
  if(recvmsg(s,&m,MSG_ERRQUEUE|MSG_DONTWAIT)<0) return n; struct cmsghdr *cm=CMSG_FIRSTHDR(&m); if(!cm) return n;
  struct sock_extended_err *e=(void*)CMSG_DATA(cm); n+= e->ee_data - e->ee_info + 1; if(e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) n+=0; } }
int main(int argc,char**argv){ size_t size=atol(argv[1]); double dur=atof(argv[2]); int zc=atoi(argv[3]);
  int ls=socket(AF_INET,SOCK_STREAM,0),one=1; struct sockaddr_in a={.sin_family=AF_INET,.sin_addr.s_addr=htonl(INADDR_LOOPBACK)};
  bind(ls,(void*)&a,sizeof a); listen(ls,1); socklen_t l=sizeof a; getsockname(ls,(void*)&a,&l);
  if(fork()==0){ int s=accept(ls,0,0); char*b=malloc(1<<20); while(read(s,b,1<<20)>0); _exit(0);} 
  int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a); setsockopt(s,IPPROTO_TCP,TCP_NODELAY,&one,sizeof one);
  if(zc && setsockopt(s,SOL_SOCKET,SO_ZEROCOPY,&one,sizeof one)) { perror("SO_ZEROCOPY"); return 1; }
  int nbuf=64; char**bufs=malloc(nbuf*sizeof*bufs); for(int i=0;i<nbuf;i++){bufs[i]=malloc(size); memset(bufs[i],i,size);} 
  long sent=0,done=0; double t0=now(),c0=cpu();
  while(now()-t0<dur){ for(int k=0;k<16;k++){ char*p=bufs[sent%nbuf]; size_t left=size; while(left){ ssize_t w=send(s,p,left,zc?MSG_ZEROCOPY:0); if(w<0){ if(errno==ENOBUFS){reap(s);continue;} perror("send"); return 1;} p+=w; left-=w;} sent++; if(zc) done+=reap(s);} }
  double t=now()-t0,c=cpu()-c0; shutdown(s,SHUT_WR); wait(NULL);
  printf("zerocopy=%d size=%zu msg_s=%.0f sender_cpu_us_per_msg=%.1f completions=%ld\n",zc,size,sent/t,c/sent*1e6,done); return 0; }
